"""Reduced precision on the CPU: int8 projections, bfloat16/float16 rows."""
