"""Pascal VOC XML, as labelImg, CVAT's VOC export and the VOC devkit write it.

One file per image: the reader, the layout and the file first, then each ``<object>``
(:func:`parse_object`: name, box, flags, attributes, landmarks in any of three dialects).
Layouts, the three landmark dialects and attributes: docs/index.md ("VOC dialects read") and
docs/formats.md ("Each reader's files and layouts"). Element paths in problems are XPath-like
and 1-based (``object[2]/bndbox``).
"""

from __future__ import annotations

import math
import ntpath
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from lxml import etree

from detloader._system.files import find_child_dir, read_capped, special_kind
from detloader.annotations.builder import ChunkBuilder
from detloader.annotations.checks import MAX_SIDE, ReadOptions
from detloader.annotations.index import AnnotationIndex
from detloader.annotations.landmarks import FACE5, LandmarkSchema
from detloader.annotations.problems import Problem, problems_of
from detloader.annotations.readers.common import (
    FolderListing,
    KnownFiles,
    Reader,
    Source,
    Stamp,
    flag_value,
    parse_flag,
    parse_floats,
    scan_files,
    stat_entry,
)
from detloader.annotations.readers.locate import IMAGE_EXTENSIONS, size_from_header, stays_inside
from detloader.annotations.readers.safe_xml import parse_xml_bytes, report_xml_error, root_tag
from detloader.annotations.splits import match_entries, report
from detloader.errors import DetloaderValueError, FileTooLargeError, UnsafeXMLError

NAME = "voc"
ANNOTATION_DIRS = ("Annotations", "annotations", "xml", "xmls", "labels_xml")
IMAGE_DIRS = ("JPEGImages", "images", "imgs", "img", "pictures", "photos")
_PER_CLASS = re.compile(r"^\S+\s+(?:-?1|0)$")  # a line of ImageSets/Main/CLASS_train.txt


def _first_file(top: Path, suffix: str) -> str | None:
    """The first file (in sorted walk order, hidden folders skipped) under ``top`` ending with ``suffix``."""
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.lower().endswith(suffix):
                return os.path.join(folder, name)
    return None


def _single_year_folder(path: Path) -> Path | None:
    """The one ``VOC20xx`` folder with ``Annotations/`` in ``path`` or in its ``VOCdevkit/``."""
    tops = [path, *filter(None, [find_child_dir(path, ("VOCdevkit",))])]
    years = [p for top in tops for p in sorted(top.glob("VOC*")) if p.is_dir() and find_child_dir(p, ("Annotations",))]
    if len(years) > 1:
        names = ", ".join(p.name for p in years)
        raise DetloaderValueError(f"path={str(path)!r} holds several VOC datasets ({names}); pass one of them")
    return years[0] if years else None


@dataclass(kw_only=True)
class VocSource(Source):
    """The VOC layout: annotation and image folders (relative to the root), split files."""

    annotation_dir: str
    image_dir: str
    split_files: list[str]
    #: one ``.xml`` file was given: the images beside it are other files' business
    one_file: bool = False


def _source(
    root: Path, ann_dir: Path, image_dir: Path, files: list[Stamp], image_sets: Path | None,
    problems: list[Problem] | None = None,
) -> VocSource:
    main = image_sets / "Main" if image_sets is not None else None
    split_stamps = scan_files(main, (".txt",), root=root, recursive=False) if main is not None and main.is_dir() else []
    image_dir_rel = os.path.relpath(image_dir.resolve(), root)
    return VocSource(
        root=root,
        files=[f[0] for f in files],
        stamp=files + split_stamps,
        image_dirs=[image_dir_rel],
        problems=problems or [],
        annotation_dir=os.path.relpath(ann_dir, root),
        image_dir=image_dir_rel,
        split_files=[f[0] for f in split_stamps],
    )


def _parse_file(root: str, rel: str, ann_dir: str, image_dir: str, b: ChunkBuilder) -> None:
    opts = b.options
    full = os.path.join(root, rel)
    try:
        ann = parse_xml_bytes(read_capped(full, opts.max_file_bytes))
    except (OSError, FileTooLargeError, UnsafeXMLError, etree.XMLSyntaxError) as err:
        report_xml_error(b, err, streamed=False)
        return
    if ann.tag != "annotation":
        b.problem("unsupported", ann.tag, f"root element <{ann.tag}> is not <annotation>", "file skipped")
        return

    top = first_children(ann)
    written = child_text(top, "filename") or ""
    filename = written.strip()
    sub = _sub_folder(os.path.dirname(rel), ann_dir)
    stem = os.path.splitext(os.path.basename(rel))[0]
    if filename and not opts.allow_outside_images and not stays_inside(os.path.join(image_dir, sub), filename):
        base = ntpath.basename(filename)
        message = f"filename={filename!r} leaves the dataset; not followed"
        b.problem("outside_dataset", "filename", message, f"looked for {base!r} inside it", "repaired")
        filename = base
    # " a .jpg", "a\\b.jpg": a name as written
    literal = written if "/" not in written and filename == written.strip() else ""
    image_rel = _resolve_image(
        root, image_dir, sub, filename, stem, child_text(top, "path"), opts.check_images, literal
    )
    if image_rel is None and opts.check_images:
        special = _special_image(root, os.path.join(image_dir, sub), filename, stem)
        if special is not None:
            rel_special, kind = special
            message = f"filename={filename or stem!r}: {rel_special} is {kind}, not a regular file"
            b.problem("not_a_regular_file", "filename", message, "image skipped")
            return
    if image_rel is None:
        shown = filename or f"{stem}.*"
        b.missing_image(
            "filename", f"filename={shown!r} not found in {os.path.join(image_dir, sub) or '.'}", filename or stem
        )
        return

    size_el = top.get("size")
    size = first_children(size_el) if size_el is not None else {}
    width, height = _int_or_zero(child_text(size, "width")), _int_or_zero(child_text(size, "height"))
    if width is None or height is None or width <= 0 or height <= 0:
        raw = f"width={child_text(size, 'width')!r} height={child_text(size, 'height')!r}"
        if size_el is None:
            raw = "<size> is missing"
        size_read = size_from_header(b, root, image_rel, "size", raw)
        if size_read is None:
            return
        width, height = size_read

    image_attrs = parse_attributes(top.get("attributes"), "attributes", b)
    image_class = image_attrs.pop(opts.image_class_attribute, None)
    if not b.add_image(
        image_rel,
        width,
        height,
        image_class=image_class,
        attributes=image_attrs,
        verified=(ann.get("verified") or "").lower() in ("yes", "true", "1"),
    ):
        return

    for j, obj in enumerate(ann.iterchildren("object"), start=1):
        parse_object(obj, f"object[{j}]", b)


def _stem(rel: str) -> str:
    return os.path.splitext(os.path.basename(rel))[0]


def _below(rel: str, ann_dir: str) -> str:
    """``rel`` below the annotation folder, without its extension (``Annotations/a/b.xml`` -> ``a/b``):
    ``os.path.join(_sub_folder(dirname), _stem(rel))`` with string work for the common case."""
    prefix = ann_dir + os.sep
    if ann_dir not in ("", ".") and rel.startswith(prefix) and os.sep not in rel[len(prefix) :]:
        return _stem(rel)
    return os.path.join(_sub_folder(os.path.dirname(rel), ann_dir), _stem(rel))


def _stems_below(files: Sequence[str], ann_dir: str) -> set[str]:
    """``{_below(rel, ann_dir) for rel in files}``, sliced from the text for a file right in the
    annotation folder (a call per file was most of listing the unannotated images)."""
    prefix = "" if ann_dir in ("", ".") else ann_dir + os.sep
    cut = len(prefix)
    out: set[str] = set()
    for rel in files:
        tail = rel[cut:]
        dot = tail.rfind(".")
        if dot > 0 and tail[0] != "." and rel.startswith(prefix) and os.sep not in tail:
            out.add(tail[:dot])
        else:
            out.add(_below(rel, ann_dir))
    return out


def _named_like(files: list[str], starts: set[str]) -> list[str]:
    """The ``files`` whose name (after the last separator) starts with one of ``starts``, in
    order. For a few starts, each is searched for in the files' text joined by newlines (one
    scan in C each, not a ``startswith`` per file)."""
    if not starts:
        return []
    text = "\n" + "\n".join(files) + "\n"
    if len(starts) > 8 or text.count("\n") != len(files) + 1:  # many, or a name holding a newline
        return [rel for rel in files if rel.rpartition(os.sep)[2].startswith(tuple(starts))]
    lines: set[int] = set()  # where each matching file's line begins in the text
    for start in starts:
        for lead in ("\n", os.sep):
            at = text.find(lead + start)
            while at >= 0:
                lines.add(text.rfind("\n", 0, at + 1))
                at = text.find(lead + start, at + 1)
    found = (text[at + 1 : text.index("\n", at + 1)] for at in sorted(lines))
    return [rel for rel in found if rel.rpartition(os.sep)[2].startswith(tuple(starts))]


def _sub_folder(folder: str, ann_dir: str) -> str:
    """The annotation's folder below the annotation folder ('' at its top); string work, as
    ``os.path.relpath`` per file costs more than parsing small files."""
    if ann_dir in ("", "."):
        return folder
    if folder == ann_dir:
        return ""
    if folder.startswith(ann_dir + os.sep):
        return folder[len(ann_dir) + 1 :]
    sub = os.path.relpath(folder or ".", ann_dir)
    return "" if sub == "." else sub


def _int_or_zero(text: str | None) -> int | None:
    """A size field as an int (fractions cut), 0 when absent; None when not a finite number
    within ``MAX_SIDE``."""
    if text is None or not text.strip():
        return 0
    try:
        value = float(text)
    except (ValueError, OverflowError):
        return None
    return int(value) if math.isfinite(value) and abs(value) <= MAX_SIDE else None


def _resolve_image(
    root: str, image_dir: str, sub: str, filename: str, stem: str, path_text: str | None, check: bool, literal: str = ""
) -> str | None:
    """Relative image path for an annotation, or None when no candidate exists; ``literal``,
    the file name exactly as written, is tried first."""
    name = ntpath.basename(filename) if "\\" in filename else filename
    candidates: list[str] = [os.path.join(image_dir, sub, literal)] if literal and literal != name else []
    if name:
        candidates.append(os.path.join(image_dir, sub, name))
        if sub:
            candidates.append(os.path.join(image_dir, name))
        if "/" in name:  # a relative path written by some tools
            candidates.append(os.path.join(image_dir, os.path.basename(name)))
    if not check:
        return os.path.normpath(candidates[0] if candidates else os.path.join(image_dir, sub, stem + ".jpg"))
    for cand in candidates:
        if os.path.isfile(os.path.join(root, cand)):
            return os.path.normpath(cand)
    bases = {os.path.splitext(name)[0], stem} if name else {stem}
    for base in sorted(b for b in bases if b):
        for ext in IMAGE_EXTENSIONS:
            cand = os.path.join(image_dir, sub, base + ext)
            if os.path.isfile(os.path.join(root, cand)):
                return os.path.normpath(cand)
    if path_text and path_text.strip():
        base = ntpath.basename(path_text.strip()) if "\\" in path_text else os.path.basename(path_text.strip())
        cand = os.path.join(image_dir, sub, base)
        if base and os.path.isfile(os.path.join(root, cand)):
            return os.path.normpath(cand)
    return None


def _special_image(root: str, folder: str, filename: str, stem: str) -> tuple[str, str] | None:
    """``(path, "a FIFO")`` of the first FIFO, socket or device where the image would be (the
    name as written, then the stem with each image extension), never opened; None when none."""
    names = [ntpath.basename(filename)] if filename else []
    names += [os.path.splitext(names[0] if names else stem)[0] + ext for ext in IMAGE_EXTENSIONS]
    for name in names:
        rel = os.path.normpath(os.path.join(folder, name))
        kind = special_kind(os.path.join(root, rel))
        if kind is not None and kind != "a folder":
            return rel, kind
    return None


class VocReader(Reader):
    """Pascal VOC XML (see the module docstring)."""

    name = NAME
    per_file = True

    def sniff(self, path: Path) -> bool:
        """True when ``path`` looks like VOC: an Annotations folder, or .xml files whose root
        element is ``<annotation>``."""
        if path.is_file():
            return path.suffix.lower() == ".xml" and root_tag(path) == "annotation"
        if not path.is_dir():
            return False
        if find_child_dir(path, ANNOTATION_DIRS) is not None or _single_year_folder(path) is not None:
            return True
        first = _first_file(path, ".xml")
        return first is not None and root_tag(Path(first)) == "annotation"

    def discover(self, path: Path, options: ReadOptions, known: KnownFiles | None = None) -> VocSource:
        """The VOC layout at ``path``: annotation files, image folder and ``ImageSets/Main`` splits;
        the annotation files stated again from ``known``'s listing while their folders are unchanged."""
        path = path.resolve()
        if path.is_file():
            root = path.parent
            image_dir = Path(options.image_dir) if options.image_dir else root
            source = _source(root, root, image_dir, [stat_entry(path, root)], None)
            source.one_file = True
            return source
        root = path if find_child_dir(path, ANNOTATION_DIRS) else _single_year_folder(path) or path
        ann_dir = find_child_dir(root, ANNOTATION_DIRS)
        if options.image_dir:
            image_dir = Path(options.image_dir)
        else:  # no annotation folder: the XML lies next to each image
            image_dir = root if ann_dir is None else find_child_dir(root, IMAGE_DIRS) or ann_dir
        ann_dir = ann_dir or root
        problems: list[Problem] = []
        follow = options.allow_outside_images
        folders: dict[str, list[int]] = {}
        files = scan_files(ann_dir, (".xml",), root=root, problems=problems, follow_outside=follow, folders=folders,
                           known=known(root) if known is not None else None)
        source = _source(root, ann_dir, image_dir, files, find_child_dir(root, ("ImageSets",)), problems)
        if not problems:
            source.file_listing = FolderListing(source.files, [], folders)
        return source

    def parse_file(self, source: VocSource, rel: str, builder: ChunkBuilder) -> None:
        _parse_file(str(source.root), rel, source.annotation_dir, source.image_dir, builder)

    def unannotated(self, source: VocSource, index: AnnotationIndex, options: ReadOptions) -> list[Problem]:
        """``unannotated_image`` problems (repaired: they never fail a read) for the images in the
        image folder (one listing, sub-folders mirrored) that no annotation file names and whose
        stem no annotation file has; FIFOs and devices among them are ``not_a_regular_file``.
        The listing is ``source.image_listing`` when that is given and current (a refresh), else
        made and left there (the cache keeps it for the next refresh)."""
        image_dir = source.image_dir
        if source.one_file or not options.check_images:
            return []
        listing = source.image_listing
        if listing is None or not listing.current(source.root):
            found: list[Problem] = []
            folders: dict[str, list[int]] = {}
            listed = scan_files(
                source.root / image_dir, IMAGE_EXTENSIONS, root=source.root, problems=found,
                follow_outside=options.allow_outside_images, stamps=False, folders=folders,
            )
            listing = source.image_listing = FolderListing([rel for rel, *_ in listed], found, folders)
        problems = list(listing.problems)
        named = set(index.image_paths())
        unnamed = {rel: os.path.splitext(os.path.relpath(rel, image_dir))[0] for rel in listing.files
                   if rel not in named}
        # the stems of the annotation files that could match (their name starts with an unnamed
        # image's stem): 100,000 stems sliced per read cost more than the rest of the check
        starts = {os.path.basename(key) for key in unnamed.values()}
        stems = _stems_below(_named_like(source.files, starts), source.annotation_dir)
        alone = [(rel, "", "no annotation file names it") for rel, key in unnamed.items() if key not in stems]
        return problems + problems_of("unannotated_image", alone, "not in the index")

    def splits(self, source: VocSource, index: AnnotationIndex) -> dict[str, np.ndarray]:
        """ImageSets/Main/NAME.txt -> image positions, matched by annotation file stem; per-class
        files (lines mostly ``id 1|-1|0``) are ignored, bad lines reported (docs/index.md, "Splits")."""
        if not source.split_files:
            return {}
        stems = [_stem(index.annotation_path(i)) for i in range(len(index))]
        position = {stem: i for i, stem in reversed(list(enumerate(stems)))}
        out: dict[str, np.ndarray] = {}
        sources = index.meta.setdefault("split_sources", {})
        for rel in source.split_files:
            try:
                with open(os.path.join(source.root, rel), encoding="utf-8-sig") as fh:
                    rows = [(f"line {n}", line.strip()) for n, line in enumerate(fh, start=1) if line.strip()]
            except (OSError, UnicodeDecodeError) as err:
                index.problems.add(Problem("unreadable_file", rel, "", str(err), "split file ignored"))
                continue
            if 2 * sum(_PER_CLASS.match(text) is not None for _, text in rows) > len(rows):
                continue
            good = [(w, t) for w, t in rows if len(t.split()) == 1 or t in position]  # "IMG 001": a stem
            bad = [(w, f"{t!r} is not one image id") for w, t in rows if len(t.split()) > 1 and t not in position]
            report(index, "split_bad_line", rel, bad, "line skipped")
            name = os.path.splitext(os.path.basename(rel))[0]
            out[name] = match_entries(index, rel, good, position)
            sources[name] = rel
        return out

    def default_landmarks(self, source: VocSource, names: Sequence[str]) -> LandmarkSchema | None:
        """FACE5's order when the names found are exactly its five (files may list the points of
        an object in any order, or omit absent ones); otherwise first appearance is kept."""
        return FACE5 if set(names) == set(FACE5.names) else None


_LM_TAG = re.compile(r"^([xy])(\d+)$")
_NUMBERS = re.compile(r"[,\s;]+")


def parse_landmarks(
    f: dict[str, etree._Element], element: str, b: ChunkBuilder
) -> tuple[list[tuple[str, float, float, int]] | None, str]:
    """Landmarks of the object whose first children by tag are ``f`` (None when it has
    none), and the field they came from (for problems and ``index.meta``)."""
    kp = f.get("keypoints")
    if kp is not None:
        children = list(kp.iterchildren("keypoint"))
        if children:
            return _named_keypoints(children, f"{element}/keypoints", b), "keypoints/keypoint"
        return _list_keypoints(kp.text or "", f"{element}/keypoints", b), "keypoints"
    lm = f.get("lm")
    if lm is not None:
        has = f.get("has_lm")
        if has is not None and parse_flag(has.text or "") is False:
            return None, "lm"
        return _retinaface_points(lm, f"{element}/lm", b), "lm"
    return None, "keypoints"


def _field(el: etree._Element, *names: str) -> str | None:
    """The first of ``names`` that ``el`` has, as an attribute or else a child element's text."""
    values = (el.get(name) if el.get(name) is not None else el.findtext(name) for name in names)
    return next((value for value in values if value is not None), None)


def _visibility(text: str | None) -> int | None:
    if text is None:
        return 2
    value = text.strip().lower()
    if value in ("true", "yes"):
        return 2
    if value in ("false", "no"):
        return 1
    try:
        v = float(value)
    except ValueError:
        return None
    return int(v) if v in (0.0, 1.0, 2.0) else None  # inf, nan, 1e309: not a visibility


def _named_keypoints(children: list, where: str, b: ChunkBuilder) -> list[tuple[str, float, float, int]]:
    points: list[tuple[str, float, float, int]] = []
    for k, child in enumerate(children, start=1):
        get = child.get
        name, xs, ys, vs = get("name"), get("x"), get("y"), get("visible")
        if name and xs is not None and ys is not None and vs in (None, "0", "1", "2"):
            try:  # the common, well-formed case: all attributes present
                points.append((name.strip(), float(xs), float(ys), 2 if vs is None else int(vs)))
                continue
            except ValueError:
                pass
        at = f"{where}/keypoint[{k}]"
        name = (_field(child, "name", "label") or "").strip()
        if not name:
            b.problem("missing_field", at, "keypoint name is missing", "point skipped")
            continue
        vis_text = _field(child, "visible", "visibility", "v")
        v = _visibility(vis_text)
        if v is None:
            b.problem("bad_value", at, f"{name}: visible={vis_text!r} is not 0, 1 or 2", "point skipped")
            continue
        x = b.number(_field(child, "x"), at, f"{name}: x", "point skipped") if v else 0.0
        y = b.number(_field(child, "y"), at, f"{name}: y", "point skipped") if v else 0.0
        if x is None or y is None:
            continue
        points.append((name, x, y, v))
    return points


def _list_keypoints(text: str, where: str, b: ChunkBuilder) -> list[tuple[str, float, float, int]] | None:
    tokens = [t for t in _NUMBERS.split(text.strip()) if t]
    if not tokens:
        return None
    values = parse_floats(tokens, where, b, "landmarks skipped")
    if values is None:
        return None
    if len(values) % 2:
        b.problem("landmark_count", where, f"{len(values)} numbers is not x,y pairs", "landmarks skipped")
        return None
    names = b.positional_names(len(values) // 2, where)
    if names is None:
        return None
    pts = np.asarray(values).reshape(-1, 2)
    return [(n, float(x), float(y), 0 if (x < 0 and y < 0) else 2) for n, (x, y) in zip(names, pts)]


def _retinaface_points(lm: etree._Element, where: str, b: ChunkBuilder) -> list[tuple[str, float, float, int]] | None:
    coords: dict[int, dict[str, str]] = {}
    for child in lm:
        match = _LM_TAG.match(str(child.tag))
        if match:
            coords.setdefault(int(match.group(2)), {})[match.group(1)] = child.text or ""
    if not coords:
        return None
    n = max(coords)
    names = b.positional_names(n, where, FACE5.names)
    if names is None:
        return None
    points = []
    for k in range(1, n + 1):
        xy = coords.get(k, {})
        x = b.number(xy.get("x"), where, f"x{k}", "point skipped")
        y = b.number(xy.get("y"), where, f"y{k}", "point skipped")
        if x is None or y is None:
            continue
        absent = x < 0 and y < 0
        points.append((names[k - 1], 0.0 if absent else x, 0.0 if absent else y, 0 if absent else 2))
    return points


def first_children(el: etree._Element) -> dict[str, etree._Element]:
    """Child elements by tag, the first of each tag (one pass: much cheaper than find())."""
    out: dict[str, etree._Element] = {}
    for child in el:
        out.setdefault(child.tag, child)
    return out


def child_text(children: dict[str, etree._Element], tag: str) -> str | None:
    """Text of the child ``tag`` (``""`` when empty), None when there is no such child."""
    el = children.get(tag)
    return None if el is None else (el.text or "")


def parse_object(obj: etree._Element, element: str, b: ChunkBuilder) -> None:
    """Add the ``<object>`` at ``element`` (``object[2]``) to the open image of ``b``."""
    f = first_children(obj)
    name = child_text(f, "name")
    if name is None:
        b.problem("missing_field", element, "<name> is missing", "object skipped")
        return
    box_el = f.get("bndbox")
    coords: list[float] | None = None
    if box_el is None:  # with landmarks the builder makes the box (boxes_from_points)
        landmarks, lm_field = parse_landmarks(f, element, b)
        if not landmarks:
            b.problem("missing_field", element, "<bndbox> is missing", "object skipped")
            return
    else:
        box = first_children(box_el)
        coords = []
        for field in ("xmin", "ymin", "xmax", "ymax"):
            text = child_text(box, field)
            try:
                coords.append(float(text))  # type: ignore[arg-type]
            except (TypeError, ValueError):
                if b.number(text, f"{element}/bndbox", field, "object skipped") is None:
                    return
                coords.append(float(text))  # type: ignore[arg-type]
    flags = {key: flag_value(b, child_text(f, key), element, key) for key in ("difficult", "truncated", "occluded")}
    attrs = parse_attributes(f.get("attributes"), f"{element}/attributes", b)
    pose = (child_text(f, "pose") or "").strip()
    if pose and pose.lower() != "unspecified" and "pose" not in attrs:
        attrs["pose"] = pose
    if box_el is not None:
        landmarks, lm_field = parse_landmarks(f, element, b)
    b.add_object(coords, name, element=element, attributes=attrs, landmarks=landmarks, landmark_field=lm_field, **flags)


def parse_attributes(el: etree._Element | None, where: str, b: ChunkBuilder) -> dict[str, str]:
    """``<attributes><attribute><name/><value/></attribute>..`` (or ``name=``/``value=``
    attributes) as ``{name: value}``; ``{}`` when ``el`` is None."""
    if el is None:
        return {}
    out: dict[str, str] = {}
    for k, attr in enumerate(el.iterchildren("attribute"), start=1):
        name = value = None
        for child in attr:
            if child.tag == "name" and name is None:
                name = child.text or ""
            elif child.tag == "value" and value is None:
                value = child.text or ""
        name = (name if name is not None else attr.get("name") or "").strip()
        if value is None:
            value = attr.get("value")
        if not name:
            b.problem("missing_field", f"{where}/attribute[{k}]", "attribute <name> is missing", "attribute skipped")
            continue
        out[name] = (value or "").strip()
    return out
