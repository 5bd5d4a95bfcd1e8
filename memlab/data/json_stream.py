"""A top-level JSON list read one item at a time, with each item's byte span: a multi-gigabyte file
(LongMemEval-M) is validated and indexed in one pass without ever being held whole."""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def scan_items(path: str | Path, chunk_size: int = 1 << 20, digest: Any = None,
               error: type[Exception] = ValueError) -> Iterator[tuple[Any, int, int]]:
    """Each item of a top-level JSON list with its byte span in the file (first byte, end), decoded one at a
    time (memory: one item plus a chunk), so a multi-gigabyte LongMemEval-M file is never held whole; every
    byte read is fed to ``digest`` (a ``hashlib`` object: the file's sha256 from this one pass). A defect
    raises ``error`` (the caller's format error) naming the file."""
    dec = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    spath = str(path)
    with open(path, "rb") as f:
        buf, pos, base, started, eof = "", 0, 0, False, False  # base: the byte offset of buf[0]

        def more() -> bool:
            nonlocal buf, pos, base, eof
            raw = f.read(chunk_size)
            if digest is not None:
                digest.update(raw)
            text = utf8.decode(raw, final=not raw)
            if not raw:
                eof = True
                return False
            base += _nbytes(buf[:pos])
            buf = buf[pos:] + text
            pos = 0
            return True

        def skip_ws() -> None:
            nonlocal pos
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos < len(buf) or not more():
                    return

        def at(i: int) -> int:
            return base + _nbytes(buf[:i])

        more()
        skip_ws()
        if pos >= len(buf) or buf[pos] != "[":
            got = buf[pos:pos + 20] if pos < len(buf) else "an empty file"
            raise error(f"{spath}: expected a JSON list of questions, got {got!r}")
        pos += 1
        while True:
            skip_ws()
            if pos < len(buf) and buf[pos] == "]":
                pos += 1
                skip_ws()  # reads the rest of the file (into the digest too)
                if pos < len(buf):
                    raise error(f"{spath}: not valid JSON (extra data after the list at byte "
                                                 f"{at(pos):,}: {buf[pos:pos + 20]!r})")
                return
            if started:
                if pos >= len(buf) or buf[pos] != ",":
                    raise error(f"{spath}: not valid JSON (expected ',' or ']' after item)")
                pos += 1
                skip_ws()
            while True:
                try:
                    item, end = dec.raw_decode(buf, pos)
                    break
                except json.JSONDecodeError as e:
                    if eof or not more():
                        raise error(f"{spath}: not valid JSON ({e.msg})") from None
                except RecursionError:  # the decoder recurses once per level of nesting
                    raise error(f"{spath}: item at byte {at(pos):,} is nested too deeply to read (more than "
                                f"about {sys.getrecursionlimit():,} levels of lists or objects)") from None
            start = at(pos)
            yield item, start, start + _nbytes(buf[pos:end])
            pos = end
            started = True


def _nbytes(text: str) -> int:
    """The UTF-8 length of ``text`` (its length when ASCII, as JSON files mostly are)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def iter_items(path: str | Path, chunk_size: int = 1 << 20, error: type[Exception] = ValueError) -> Iterator[Any]:
    """The items of a top-level JSON list, one at a time (`scan_items` without the spans)."""
    for item, _, _ in scan_items(path, chunk_size, error=error):
        yield item
