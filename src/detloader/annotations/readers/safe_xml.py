"""Parsing XML that comes from strangers, and what the XML readers share.

Before lxml sees a byte, a DOCTYPE with an internal subset (entity declarations: "billion
laughs") or an external identifier (file or network access) is refused; a plain
``<!DOCTYPE annotation>`` is accepted. The parser also runs without entities, DTDs or network,
as a second line of defence, and a size cap bounds memory (docs/index.md, "Untrusted XML").
The rest serves the VOC, CVAT and imglab readers: sniffing without parsing, streaming large
files (:func:`iter_xml`), and one problem per file that cannot be read (:func:`stream_records`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

from lxml import etree

from detloader._system.files import open_regular
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.readers.common import read_head
from detloader.errors import DetloaderTypeError, DetloaderValueError, FileTooLargeError, UnsafeXMLError

_DOCTYPE = re.compile(rb"<!DOCTYPE\b([^>\[]*)(\[)?", re.IGNORECASE)
_EXTERNAL = re.compile(rb"\b(SYSTEM|PUBLIC)\b")


def check_prolog(head: bytes) -> None:
    """Refuse a DOCTYPE with an internal subset or an external identifier in ``head``, the start of
    the document up to (at least) the root start tag.
    """
    match = _DOCTYPE.search(head)
    if match is None:
        if b"<!ENTITY" in head.upper():
            raise UnsafeXMLError("entity declaration outside a DOCTYPE refused")
        return
    if match.group(2):
        raise UnsafeXMLError("DOCTYPE with an internal subset (entity declarations) refused")
    if _EXTERNAL.search(match.group(1)):
        raise UnsafeXMLError("DOCTYPE with an external identifier (SYSTEM/PUBLIC) refused")


#: lxml settings for untrusted input: no entities, no network, no DTD, no comments or PIs.
_SAFE = dict(resolve_entities=False, no_network=True, load_dtd=False, remove_comments=True, remove_pis=True)
_PARSER = etree.XMLParser(dtd_validation=False, huge_tree=False, **_SAFE)


def prolog_end(data: bytes) -> int:
    """Index just past the start of the root element (where a DOCTYPE can no longer appear)."""
    pos = 0
    n = len(data)
    while pos < n:
        lt = data.find(b"<", pos)
        if lt < 0 or lt + 1 >= n:
            return n
        nxt = data[lt + 1 : lt + 2]
        if nxt in (b"?", b"!"):
            # processing instruction, comment or declaration: skip to its end
            if data.startswith(b"<!--", lt):
                end = data.find(b"-->", lt + 4)
                pos = n if end < 0 else end + 3
            elif data[lt + 2 : lt + 9].upper() == b"DOCTYPE":
                # up to the end of the declaration; an internal subset ends with "]>"
                bracket = data.find(b"[", lt)
                close = data.find(b">", lt)
                if 0 <= bracket < close:
                    end = data.find(b"]", bracket)
                    close = data.find(b">", end if end >= 0 else bracket)
                pos = n if close < 0 else close + 1
            else:
                end = data.find(b">", lt)
                pos = n if end < 0 else end + 1
        else:
            return lt + 1
    return n


def _ascii_head(data: bytes, limit: int = 64 * 1024) -> bytes:
    """The start of the document as ASCII-compatible bytes (UTF-16/32 are decoded first)."""
    head = data[:limit]
    if head[:4] in (b"\x00\x00\xfe\xff", b"\xff\xfe\x00\x00") or head[:4].count(b"\x00") == 3:
        return head.decode("utf-32", errors="ignore").encode("utf-8")
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or b"\x00" in head[:2]:
        return head.decode("utf-16", errors="ignore").encode("utf-8")
    return head


def _check_parsed(root: etree._Element) -> None:
    """Second line of defence: refuse a document the parser saw a DTD subset or entities in."""
    docinfo = root.getroottree().docinfo
    dtd = docinfo.internalDTD
    if docinfo.system_url or docinfo.public_id:
        raise UnsafeXMLError("DOCTYPE with an external identifier (SYSTEM/PUBLIC) refused")
    if dtd is not None and (list(dtd.iterentities()) or list(dtd.iterelements())):
        raise UnsafeXMLError("DOCTYPE with an internal subset (entity declarations) refused")


def parse_xml_bytes(data: bytes) -> etree._Element:
    """The root element of one small XML document held in memory; :class:`UnsafeXMLError` or
    ``etree.XMLSyntaxError`` (the caller turns it into a problem).
    """
    head = _ascii_head(data)
    check_prolog(head[: prolog_end(head)])
    root = etree.fromstring(data, _PARSER)
    if b"<!" in head:  # only documents with a declaration can carry a DTD
        _check_parsed(root)
    return root


def iterparse_safe(path: str, tag: str | tuple[str, ...], events: tuple[str, ...] = ("end",)):
    """Stream an XML file element by element, the prolog checked first and the parser as
    restricted as :func:`parse_xml_bytes` (plus ``huge_tree`` for long text nodes). The generator
    owns the open file and closes it when the iteration ends, fails or is abandoned.
    """
    with open_regular(path) as fh:  # a FIFO would block here
        head = _ascii_head(fh.read(64 * 1024))
        check_prolog(head[: prolog_end(head)])
        fh.seek(0)
        # fed by hand: the elements complete before a syntax error are yielded before it is
        # raised, whatever the libxml2 version buffers ahead
        parser = etree.XMLPullParser(events=events, tag=tag, huge_tree=True, base_url=path, **_SAFE)
        while True:
            chunk, error = fh.read(64 * 1024), None
            try:
                parser.feed(chunk) if chunk else parser.close()
            except etree.XMLSyntaxError as err:
                error = err
            yield from parser.read_events()
            if error is not None:
                raise error
            if not chunk:
                return


_TAG = re.compile(rb"<([A-Za-z_][\w.-]*)[\s>/]")
_SKIP = re.compile(rb"<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^>]*>", re.S)


def root_tag(path: Path) -> str | None:
    """Name of the root element of an XML file, from its first bytes (no parse)."""
    head = _SKIP.sub(b"", read_head(path, 8192))
    match = _TAG.search(head)
    return match.group(1).decode("ascii", "replace") if match else None


def xml_files_with_root(folder: Path, tag: str) -> list[Path]:
    """``.xml`` files in ``folder`` (sorted) whose root element is ``tag``."""
    return [p for p in sorted(folder.glob("*.xml")) if p.is_file() and root_tag(p) == tag]


def sniff_xml(path: Path, tag: str) -> bool:
    """An ``.xml`` file whose root element is ``tag``, or a folder holding one at its top."""
    if path.is_file():
        return path.suffix.lower() == ".xml" and root_tag(path) == tag
    return path.is_dir() and bool(xml_files_with_root(path, tag))


def annotation_xml(path: Path, tag: str, kind: str, preferred: str | None = None) -> Path:
    """The annotation file of a one-file format: ``path`` itself, or the one ``.xml`` file at
    the top of folder ``path`` whose root element is ``tag`` (``preferred`` names the file
    that wins when there are several); a ValueError naming what was found otherwise."""
    if path.is_file():
        return path
    found = xml_files_with_root(path, tag)
    if len(found) != 1 and preferred is not None:
        found = [p for p in found if p.name == preferred] or found
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise DetloaderValueError(f"path={str(path)!r} holds {len(found)} {kind} files ({names}); pass one of them")
    return found[0]


def iter_xml(path: str, tags: str | tuple[str, ...]) -> Iterator[etree._Element]:
    """Yield each complete element named ``tags`` of a (large) XML file, in document order.

    Once the caller is done with an element it is cleared and its earlier siblings removed, so
    memory is bounded by one record, not the file. Errors propagate.
    """
    for _event, element in iterparse_safe(path, tags, events=("end",)):
        yield element
        element.clear(keep_tail=False)
        parent = element.getparent()
        if parent is not None:
            while element.getprevious() is not None:
                del parent[0]


#: What reading a streamed XML file raises when the file, not the reader, is at fault.
STREAM_ERRORS = (UnsafeXMLError, etree.XMLSyntaxError, OSError)


def report_xml_error(b: ChunkBuilder, err: Exception, *, streamed: bool) -> None:
    """Report an XML file that cannot be read as one problem of the current file (``streamed``:
    the records before the error are kept, so the rest of the file is what is skipped).
    """
    if isinstance(err, UnsafeXMLError):
        b.problem("unsafe_xml", "", str(err), "file skipped")
    elif isinstance(err, etree.XMLSyntaxError):
        action = "rest of the file skipped" if streamed else "file skipped"
        message = str(err.msg if getattr(err, "msg", None) else err).split(", line ")[0]  # the line is the element
        b.problem("unparseable", f"line {err.lineno}", message, action)
    elif isinstance(err, FileTooLargeError):
        b.problem("file_too_large", "", str(err), "file skipped")
    elif isinstance(err, OSError):
        b.problem("unreadable_file", "", f"{err.strerror or err}", "file skipped")
    else:
        raise DetloaderTypeError(f"err={err!r} is not an XML file error")


def stream_records(
    path: str, tags: tuple[str, ...], root: str, b: ChunkBuilder, record: Callable[[etree._Element], None]
) -> bool:
    """Call ``record`` on each element named ``tags`` of the file (:func:`iter_xml`); report a root
    other than ``<root>``. False when the file could not be read to its end (one problem), else True.
    """
    seen_root = False
    try:
        for element in iter_xml(path, (*tags, root)):
            if element.tag == root:
                seen_root = True
            else:
                record(element)
    except STREAM_ERRORS as err:
        report_xml_error(b, err, streamed=True)
        return False
    if not seen_root:
        b.problem("unsupported", "", f"root element is not <{root}>", "file skipped")
    return True
