"""What the native families are built of: attention and the encoder, the packed batch, checkpoints, pixels."""
