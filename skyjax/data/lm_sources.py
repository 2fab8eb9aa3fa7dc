"""Documents for a language model, read whole into memory: each a ``(where, text)`` pair, where
``where`` names the file (and line) it came from. :mod:`.lm_text` tokenises and packs them.

Sources (``config.data.name``, and each of ``config.data.eval_files``):

* a ``.txt`` file, or a folder: every ``.txt`` file under it (sub-folders too), in sorted order
  of their paths. ``txt_documents="file"`` (the default): each file is one document;
  ``"paragraph"``: a file holds documents separated by one or more blank lines (lines of
  whitespace only). A document's text is kept as written, newlines included, less the
  whitespace around it;
* a ``.jsonl`` file (one JSON object per line) or a ``.csv`` file (a header line, standard
  quoting): each row's ``text`` column (``config.data.text_column``) is one document;
* ``hf:DIR`` (``datasets``' ``save_to_disk``) or ``hf:NAME`` (``datasets.load_dataset``, offline
  from its cache): each row's ``text`` column of a split (:func:`hf_documents`).

Files are UTF-8, with or without a byte-order mark. Empty documents (a blank row, a file of
whitespace in a folder) are skipped; a source with none is an error. Every problem is one line,
a :class:`~skyjax.data.text.DataError` naming the file and line: a missing or empty file, a
binary file (a NUL byte, or bytes that are not UTF-8: the line and byte offset), no ``text``
column (the columns it has), a malformed JSON line, a ``text`` value that is not a string.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from skyjax.data import readers
from skyjax.data.text import DataError

Document = tuple[str, str]  # (where it came from: "file" or "file:line", its text)
TEXT_SUFFIX = ".txt"
ROW_SUFFIXES = (".jsonl", ".csv")
TXT_DOCUMENTS = ("file", "paragraph")
BOM = b"\xef\xbb\xbf"


def is_text_source(name: str) -> bool:
    """Whether ``name`` is a source this module reads (a ``.txt``, ``.jsonl`` or ``.csv`` file,
    a folder, or ``hf:...``), judged by its form: nothing is read."""
    return (readers.is_hf(name) or name.lower().endswith((TEXT_SUFFIX, *ROW_SUFFIXES))
            or os.path.isdir(name))


def _line(data: bytes, offset: int) -> int:
    """The line (from 1) of byte ``offset`` of ``data``."""
    return data.count(b"\n", 0, offset) + 1


def decode(path: str) -> str:
    """The text of ``path``: UTF-8 (a leading byte-order mark dropped). A file that is missing,
    empty (whitespace only), holds a NUL byte or is not UTF-8 raises ``DataError`` naming the
    line and byte offset."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: file not found")
    with open(path, "rb") as f:
        data = f.read()
    skip = len(BOM) if data.startswith(BOM) else 0
    nul = data.find(b"\x00")
    if nul >= 0:
        raise DataError(f"{path}:{_line(data, nul)}: a binary file, not text (a NUL byte at "
                        f"byte offset {nul})")
    try:
        text = data[skip:].decode("utf-8")
    except UnicodeDecodeError as e:
        at = skip + e.start
        raise DataError(f"{path}:{_line(data, at)}: not UTF-8 text (byte 0x{data[at]:02x} at "
                        f"byte offset {at}; a binary file?)") from None
    if not text.strip():
        raise DataError(f"{path}: empty file (no text)")
    return text


def paragraphs(path: str, text: str) -> list[Document]:
    """The blank-line-separated documents of ``text``, each named ``path:line`` by its first
    line."""
    out: list[Document] = []
    lines: list[str] = []
    start = 0
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            if not lines:
                start = n
            lines.append(line)
        elif lines:
            out.append((f"{path}:{start}", "\n".join(lines).strip()))
            lines = []
    if lines:
        out.append((f"{path}:{start}", "\n".join(lines).strip()))
    return out


def txt_files(folder: str) -> list[str]:
    """Every ``.txt`` file under ``folder``, sorted by path."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        out += [os.path.join(root, f) for f in files if f.lower().endswith(TEXT_SUFFIX)]
    return sorted(out)


def _txt(path: str, txt_documents: str, in_folder: bool) -> list[Document]:
    if in_folder:  # a folder's blank file is skipped, a binary one is not
        with open(path, "rb") as f:
            if not f.read().strip():
                return []
    text = decode(path)
    if txt_documents == "paragraph":
        return paragraphs(path, text)
    return [(path, text.strip())]


def _rows(path: str, text_column: str) -> list[Document]:
    decode(path)  # the whole file is text: else one line naming the byte
    out: list[Document] = []
    seen = False
    for where, row, columns in readers.rows(path, (text_column,)):
        seen = True
        if text_column not in row:
            csv_file = path.lower().endswith(".csv")
            where, what = (f"{path}:1", "the header") if csv_file else (where, "this row")
            raise DataError(f"{where}: no column {text_column!r} in {what} (it has "
                            f"{', '.join(map(repr, columns)) or 'no columns'}; "
                            "config.data.text_column)")
        value = row[text_column]
        if not isinstance(value, str):
            raise DataError(f"{where}: column {text_column!r} is "
                            f"{'missing' if value is None else 'a ' + type(value).__name__}, "
                            "not text")
        if value.strip():
            out.append((where, value.strip()))
    if not seen:
        raise DataError(f"{path}: no rows (a header only?)")
    return out


def read_documents(path: str, *, text_column: str = "text", txt_documents: str = "file",
                   key: str = "config.data.name") -> list[Document]:
    """The documents of the file or folder ``path`` (``key`` is the config key that named it),
    in order; raises ``DataError`` naming the file and line."""
    if txt_documents not in TXT_DOCUMENTS:
        raise DataError(f"config.data.txt_documents={txt_documents!r} is not one of "
                        f"{', '.join(map(repr, TXT_DOCUMENTS))}")
    if os.path.isdir(path):
        files = txt_files(path)
        if not files:
            raise DataError(f"{key}={path!r}: a folder with no {TEXT_SUFFIX} files")
        docs = [d for f in files for d in _txt(f, txt_documents, in_folder=True)]
    elif not os.path.exists(path):
        raise DataError(f"{key}={path!r}: no such file or folder")
    elif path.lower().endswith(TEXT_SUFFIX):
        docs = _txt(path, txt_documents, in_folder=False)
    elif path.lower().endswith(ROW_SUFFIXES):
        docs = _rows(path, text_column)
    else:
        raise DataError(f"{key}={path!r}: not a .txt, .jsonl or .csv file, nor a folder of "
                        ".txt files")
    if not docs:
        raise DataError(f"{path}: no documents (every text is empty; {key})")
    return docs


def hf_documents(name: str, splits: Sequence[str], *, subset: str = "",
                 text_column: str = "text") -> dict[str, list[Document]]:
    """``{split: documents}`` of the Hugging Face dataset ``name`` (``hf:DIR`` or ``hf:NAME``,
    opened by :func:`skyjax.data.readers.hf_dataset_dict`), each row's ``text_column`` one
    document, named ``name[split] row n``."""
    dataset = readers.hf_dataset_dict(name, subset)
    out = {}
    for split in splits:
        if split not in dataset:
            raise DataError(f"{name}: no split {split!r} (it has "
                            f"{', '.join(map(repr, dataset))})")
        ds = dataset[split]
        where = f"{name}[{split}]"
        if text_column not in ds.column_names:
            raise DataError(f"{where}: no column {text_column!r} (it has "
                            f"{', '.join(map(repr, ds.column_names))}; config.data.text_column)")
        docs = []
        for n, value in enumerate(ds[text_column]):
            if not isinstance(value, str):
                raise DataError(f"{where} row {n}: column {text_column!r} is "
                                f"{'missing' if value is None else type(value).__name__}, "
                                "not text")
            if value.strip():
                docs.append((f"{where} row {n}", value.strip()))
        if not docs:
            raise DataError(f"{where}: no documents (every {text_column!r} is empty)")
        out[split] = docs
    return out
