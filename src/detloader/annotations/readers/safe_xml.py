"""Parsing XML that comes from strangers.

Annotation files are untrusted input. Before lxml sees a byte we refuse document type
declarations with an internal subset (where entity declarations live: the "billion laughs"
attack) or with an external identifier (SYSTEM/PUBLIC: file or network access). The parser
itself is configured with no entity resolution, no DTD loading and no network, as a second
line of defence. A size cap bounds memory. A plain ``<!DOCTYPE annotation>`` is accepted.
"""

from __future__ import annotations

import re

from lxml import etree

#: Default cap on one annotation file (VOC, imglab); large single-file formats set their own.
MAX_XML_BYTES = 16 * 1024 * 1024

_DOCTYPE = re.compile(rb"<!DOCTYPE\b([^>\[]*)(\[)?", re.IGNORECASE)
_EXTERNAL = re.compile(rb"\b(SYSTEM|PUBLIC)\b")


class UnsafeXMLError(ValueError):
    """The document declares entities or references external resources."""


def check_prolog(head: bytes) -> None:
    """Refuse a DOCTYPE with an internal subset or an external identifier.

    ``head`` is the start of the document, up to (at least) the root element's start tag.
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


def _make_parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_comments=True,
        remove_pis=True,
    )


_PARSER = _make_parser()


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
    """Parse one small XML document held in memory and return its root element.

    Raises:
        UnsafeXMLError: DTD with entities or external identifiers.
        etree.XMLSyntaxError: not well-formed (the caller turns it into a Problem).
    """
    head = _ascii_head(data)
    check_prolog(head[: prolog_end(head)])
    root = etree.fromstring(data, _PARSER)
    if b"<!" in head:  # only documents with a declaration can carry a DTD
        _check_parsed(root)
    return root


def iterparse_safe(path: str, tag: str | tuple[str, ...], events: tuple[str, ...] = ("end",)):
    """Stream a large XML file element by element (for single-file formats such as CVAT).

    The prolog is checked first; the parser runs with the same restrictions as
    :func:`parse_xml_bytes` plus ``huge_tree`` so that long text nodes are allowed.
    """
    with open(path, "rb") as fh:
        head = _ascii_head(fh.read(64 * 1024))
    check_prolog(head[: prolog_end(head)])
    return etree.iterparse(
        path,
        events=events,
        tag=tag,
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        huge_tree=True,
        remove_comments=True,
        remove_pis=True,
    )
