"""POST /v1/files' multipart/form-data body, parsed as it arrives (python-multipart's streaming parser):
the `file` part is written straight into the batch folder (store.IncomingFile: bounded as its bytes
arrive), the form's other fields (`purpose`) are kept, each up to FIELD_BYTES. The body is never held
whole. Synchronous: each chunk is fed on the executor."""

from __future__ import annotations

from collections.abc import Callable

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from server.batches.store import IncomingFile

FIELD_BYTES = 1024  # a form field other than the file: `purpose`
FILE_FIELD = "file"


class FormError(ValueError):
    """A body that is no usable form (400), naming the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class NotAForm(ValueError):
    """A body that is not multipart/form-data (415)."""


class FileForm:
    def __init__(self, content_type: str, open_file: Callable[[], IncomingFile]) -> None:
        mime, options = parse_options_header(content_type)
        if mime != b"multipart/form-data":
            raise NotAForm("POST /v1/files takes multipart/form-data")
        boundary = options.get(b"boundary")
        if not boundary:
            raise FormError("the multipart/form-data content type has no boundary")
        self._open_file = open_file
        self.file: IncomingFile | None = None
        self.filename: str | None = None
        self.fields: dict[str, bytes] = {}
        self.ended = False
        self._headers: dict[bytes, bytes] = {}
        self._header = [b"", b""]  # the header being read: name, value
        self._name: str | None = None  # the part being read (None: its data goes to the file)
        self._value = bytearray()
        self._parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._headers.clear,
                "on_header_field": lambda data, start, end: self._add(0, data[start:end]),
                "on_header_value": lambda data, start, end: self._add(1, data[start:end]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._part_begins,
                "on_part_data": self._data,
                "on_part_end": self._part_end,
                "on_end": self._end,
            },
        )

    def feed(self, chunk: bytes) -> None:
        """The body's next bytes: FormError for a malformed form; the file's bounds' NoRoom as they pass."""
        try:
            self._parser.write(chunk)
        except MultipartParseError as exc:
            raise FormError(f"the multipart/form-data body is malformed: {exc}") from None

    def completed(self) -> tuple[str | None, str]:
        """The whole form has arrived: the file's name and the `purpose` field."""
        if not self.ended:
            raise FormError("the multipart/form-data body ends before its closing boundary")
        if self.file is None:
            raise FormError(f"missing required field '{FILE_FIELD}'", FILE_FIELD)
        return self.filename, self.fields.get("purpose", b"").decode("utf-8", "replace")

    def discard(self) -> None:
        if self.file is not None:
            self.file.discard()

    def _add(self, which: int, data: bytes) -> None:
        self._header[which] += data

    def _header_end(self) -> None:
        self._headers[self._header[0].strip().lower()] = self._header[1].strip()
        self._header = [b"", b""]

    def _part_begins(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition"))
        name = options.get(b"name", b"").decode("utf-8", "replace")
        self._value.clear()
        self._name = name
        if name == FILE_FIELD:
            if self.file is not None:
                raise FormError(f"more than one '{FILE_FIELD}' field", FILE_FIELD)
            filename = options.get(b"filename")
            self.filename = filename.decode("utf-8", "replace") if filename else None
            self.file = self._open_file()
            self._name = None

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._name is None:
            assert self.file is not None
            self.file.write(memoryview(data)[start:end])
            return
        self._value += data[start:end]
        if len(self._value) > FIELD_BYTES:
            raise FormError(f"the form field '{self._name}' is longer than {FIELD_BYTES} bytes", self._name)

    def _part_end(self) -> None:
        if self._name is not None:
            self.fields[self._name] = bytes(self._value)
        self._name = ""  # between parts: no data expected

    def _end(self) -> None:
        self.ended = True
