"""Traces decoded into compact event records instead of a million dicts.

A dict per event is most of a large import's time: building it (JSON decoding), reading it (every
field lookup misses the cache) and freeing it. msgspec decodes each event straight into a slotted
record whose absent fields hold the default the column parser would use (`dict.get(k, default)`),
so one C-level `attrgetter` pass reads a field of every event.

Two roads: opscope's own export (`otherData.opscope`; its args typed too, the whole file in one pass
where it is laid out as we write it), and every other Chrome/Kineto trace (`KinetoEvent`, its args
JSON text decoded when read; a cpu_op's as the four fields the import reads, `OpArgs`). A file whose
events use a field outside the Chrome format's, a value a record cannot hold (a null pid), or invalid
JSON is decoded into dicts as before, so every refusal and every odd trace keeps the one parser that
judges it (`read_json`, `event_parser.parse_events`). Both roads decode with msgspec
(common.loads) and must end in the same run: tests/test_import_fuzz.py fuzzes real traces to check it.
"""
from __future__ import annotations

from itertools import repeat
from operator import attrgetter
from typing import Annotated, Any

import msgspec

from .common import INDEX_MAX, INT64_MAX, JSON_ERRORS, loads


# what the parsers read with a default (pid, tid, dur: 0) must not be null in a typed event: where the file
# says null, dict.get(k, 0) gives None and a record its default, so such a file is left to the dict road
_NOT_NULL = bool | int | float | str | list | dict


class _Record(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    def get(self, key, default=None):
        """Dict-like reads for the few records (metadata, step spans) code reads one at a time."""
        v = getattr(self, key) if key in self.__struct_fields__ else None
        return default if v is None else v


# what the column parser checks every value of, checked here instead while decoding: a file whose values are
# anything else (a step as text, a negative byte count, a null phase) is left to the dict road, which reads
# them as before -- so a typed export's columns need no second look (column_parser.parse_columns, `checked`)
_INDEX = Annotated[int, msgspec.Meta(ge=0, le=INDEX_MAX)]          # steps and seqs: INTEGER columns
_COUNT = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]          # bytes and FLOPs


class Args(_Record):
    """An event's args as opscope's export writes them; absent fields read as the column parser's
    defaults (step 0, fallback False, phase "forward", fwd_node "")."""
    node: str | None = None
    step: _INDEX = 0
    seq: _INDEX | None = None
    module: str | None = None
    source: str | None = None
    input_shapes: str | None = None
    input_dtypes: str | None = None
    output_shapes: str | None = None
    output_dtypes: str | None = None
    bytes: _COUNT | None = None
    flops: _COUNT | None = None
    fallback: bool = False
    phase: str = "forward"
    fwd_node: str = ""
    members: Any = None
    live_bytes: Any = None
    name: Any = None
    sort_index: Any = None


NO_ARGS = Args()


class _Chrome(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The Chrome trace event fields both records share; absent ones read as `column_parser.parse_columns`'
    defaults (pid, tid, dur: 0)."""
    ph: Any = None
    name: Any = None
    cat: Any = None
    pid: _NOT_NULL = 0
    tid: _NOT_NULL = 0
    ts: Any = None
    dur: _NOT_NULL = 0


class Event(_Chrome, _Record):
    """One event of our own export, its args typed."""
    args: Args | None = None
    id: Any = None
    bp: Any = None
    s: Any = None


_ABSENT = msgspec.Raw(b"")       # an event written without args (a null one is Raw(b"null"))


class KinetoEvent(_Chrome):
    """One torch.profiler (Kineto) event -- or any Chrome trace event made of the usual fields. Reads like
    the dict it replaces: `get` and `in` tell an absent id, bp, s or args from a null one (UNSET), and the
    fields the column parser reads hold its defaults.

    Its args stay JSON text until read (`args` decodes them, each time): two events in three of a
    with_stack trace are Python frames whose args nothing reads, and a dict each for them was a third of
    the decoding and most of the freeing. What a read gives is what the dict road's decoding of the
    same bytes gives, a list or a number included; args that do not decode (a number past a double's
    range) refuse the file with the dict road's line (kineto.parse). Args nobody reads are never decoded,
    so there such a number is not refused: the one difference between the roads."""
    raw_args: msgspec.Raw = msgspec.field(default=_ABSENT, name="args")
    id: Any = msgspec.UNSET
    bp: Any = msgspec.UNSET
    s: Any = msgspec.UNSET

    @property
    def args(self):
        return loads(self.raw_args) if self.raw_args else None

    def get(self, key, default=None):
        if key == "args":
            return self.args if self.raw_args else default
        v = getattr(self, key, msgspec.UNSET) if key in self.__struct_fields__ else msgspec.UNSET
        return default if v is msgspec.UNSET else v

    def __contains__(self, key) -> bool:
        if key == "args":
            return bool(self.raw_args)          # without decoding them
        return self.get(key, msgspec.UNSET) is not msgspec.UNSET

    def keys(self) -> list:
        return [k for k in self.__struct_encode_fields__ if k in self]

    def __getitem__(self, key):
        v = self.get(key, msgspec.UNSET)
        if v is msgspec.UNSET:
            raise KeyError(key)
        return v


class OpArgs(msgspec.Struct, gc=False):
    """What the importer reads of a cpu_op's args, the inputs kept as JSON text: most ops repeat the
    inputs of another (every layer, every step), so their text is a key, and only distinct ones are
    decoded (chrome.all_inputs). The rest of the args (Input Strides, Record function id, ...) is
    skipped, never built. Reads like the dict: `get`."""
    dims: msgspec.Raw = msgspec.field(default=_ABSENT, name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=_ABSENT, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_ABSENT, name="Concrete Inputs")
    external_id: Any = msgspec.field(default=None, name="External id")

    def get(self, key, default=None):
        v = getattr(self, _OP_ARG_FIELDS[key]) if key in _OP_ARG_FIELDS else None
        if isinstance(v, msgspec.Raw):
            v = loads(v) if v else None
        return default if v is None else v

    def inputs_key(self) -> tuple:
        """The text of Input Dims and Input type: two ops with the same have the same inputs."""
        return bytes(self.dims), bytes(self.types)


_OP_ARG_FIELDS = {"Input Dims": "dims", "Input type": "types", "Concrete Inputs": "concrete",
                  "External id": "external_id"}
_OP_ARGS = msgspec.json.Decoder(OpArgs)


def op_args(events: list) -> list | None:
    """The args of KinetoEvent cpu_ops as `get`-able records ({} where they are not an object, as
    `chrome.arg_dicts` gives), or None for other events (arg_dicts reads those)."""
    if not (events and isinstance(events[0], KinetoEvent)):
        return None
    try:
        return list(map(_OP_ARGS.decode, map(attrgetter("raw_args"), events)))     # one C-level pass
    except JSON_ERRORS:       # args absent, null or not an object somewhere: event by event
        return [_OP_ARGS.decode(e.raw_args) if memoryview(e.raw_args)[:1] == b"{" else {} for e in events]


class Events(list):
    """Typed events, with the JSON they came from: a parser that needs dicts decodes it again."""
    raw = None          # the traceEvents array's bytes
    data = None         # or the whole document's

    def as_dicts(self) -> list:
        if self.raw is None:
            return loads(self.data)["traceEvents"]
        return loads(self.raw)


def column(events: list, key: str, default=None) -> list:
    """[e.get(key, default) for e in events] in one C-level pass, for dicts or typed events."""
    if events and isinstance(events[0], (_Record, _Chrome)):
        return list(map(attrgetter(key), events))       # an absent field already holds its default
    return list(map(dict.get, events, repeat(key), repeat(default)))


class _Export(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """The whole of an export as opscope writes it: decoded in one pass (no scan first for the events)."""
    traceEvents: list[Event]
    otherData: dict[str, Any]
    displayTimeUnit: Any = None


_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENTS = msgspec.json.Decoder(list[Event])
_EXPORT = msgspec.json.Decoder(_Export)
# the tail of an export as opscope writes it (otherData last): only such a file is decoded in one pass
_EXPORT_TAIL = b'"otherData":{"opscope":'
_OURS = b'"opscope"'


def decode(data: bytes):
    """-> the document with its traceEvents as `Events`, or None when the file is not one to decode
    this way (the caller decodes it into dicts, which also judges a broken file)."""
    # otherData names opscope near one end of the file (last as we write it, first where keys were sorted):
    # anything else -- a torch.profiler trace -- takes the Kineto road
    if _OURS not in data[-65536:] and _OURS not in data[:65536]:
        return _kineto(data)
    if _EXPORT_TAIL in data[-4096:]:
        try:
            doc = _EXPORT.decode(data)
        except JSON_ERRORS:
            pass                        # not as opscope writes it: the general path below judges it
        else:
            if doc.otherData.get("opscope"):
                events = Events(doc.traceEvents)
                events.raw = None       # as_dicts() decodes the file again
                events.data = data
                out = {"traceEvents": events, "otherData": doc.otherData}
                if doc.displayTimeUnit is not None:
                    out["displayTimeUnit"] = doc.displayTimeUnit
                return out
    try:
        top = _TOP.decode(data)
        raw = top.get("traceEvents")
        other = loads(top["otherData"]) if "otherData" in top else None
        if raw is None or not (isinstance(other, dict) and other.get("opscope")):
            return None
        events = Events(_EVENTS.decode(raw))
    except JSON_ERRORS:
        return None
    events.raw = raw
    try:
        doc = {k: loads(v) for k, v in top.items() if k not in ("traceEvents", "otherData")}
    except JSON_ERRORS:
        return None
    doc["otherData"], doc["traceEvents"] = other, events
    return doc


class _KinetoDoc(msgspec.Struct, gc=False):
    """A torch.profiler trace in one pass: its events, and the top-level keys an importer reads (the rest --
    deviceProperties, schemaVersion, ... -- nothing reads, so nothing keeps)."""
    traceEvents: list[KinetoEvent]
    otherData: Any = msgspec.UNSET
    distributedInfo: Any = msgspec.UNSET
    baseTimeNanoseconds: Any = msgspec.UNSET


_KINETO_DOC = msgspec.json.Decoder(_KinetoDoc)


def _kineto(data: bytes):
    """A trace that is not ours, its events as KinetoEvent records; None where one of them is not made of
    the usual fields (the dict road takes the file, and judges it)."""
    try:
        top = _KINETO_DOC.decode(data)
    except JSON_ERRORS:
        return None
    events = Events(top.traceEvents)
    events.data = data              # as_dicts() decodes the file again
    doc = {k: getattr(top, k) for k in top.__struct_fields__ if getattr(top, k) is not msgspec.UNSET}
    doc["traceEvents"] = events
    return doc


def is_typed(events) -> bool:
    return isinstance(events, Events)


def is_record(v) -> bool:
    return isinstance(v, (_Record, _Chrome))
