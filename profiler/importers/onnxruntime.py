"""ONNX Runtime profile JSON (`SessionOptions.enable_profiling`): a list of Chrome-style X events.

    {"cat": "Node", "name": "/fc1/Gemm_kernel_time", "ts": 112, "dur": 37, "pid": 1, "tid": 7,
     "args": {"op_name": "Gemm", "provider": "CPUExecutionProvider",
              "input_type_shape": [{"float": [1, 16]}, ...], "output_type_shape": [...], ...}}

Each node runs as `_fence_before`, `_kernel_time`, `_fence_after`; the kernel time is the op. Every
`model_run` Session event is one step. Times are microseconds from the session's start.
"""
from __future__ import annotations

from collections import Counter

from opscope.runtime.errors import UsageError

from .common import DTYPES, EventTable, as_int as _int, check_other_times, shapes_json, span_ns, where_of
from .names import op_for_onnx

_PROVIDER_DEVICE = {"CPUExecutionProvider": "cpu", "CUDAExecutionProvider": "cuda", "ROCMExecutionProvider": "rocm",
                    "TensorrtExecutionProvider": "cuda", "DmlExecutionProvider": "dml",
                    "CoreMLExecutionProvider": "coreml", "OpenVINOExecutionProvider": "openvino"}


def is_onnxruntime(doc) -> bool:
    return isinstance(doc, list) and any(isinstance(e, dict) and e.get("cat") in ("Node", "Session")
                                         for e in doc[:1000])


def parse(doc: list, source: str) -> tuple[EventTable, dict]:
    table = EventTable()
    skipped: Counter = Counter()
    runs: list[tuple[int, int]] = []
    has_kernel_time = any(isinstance(e, dict) and str(e.get("name", "")).endswith("_kernel_time") for e in doc)
    providers: Counter = Counter()
    for i, ev in enumerate(doc):
        if not isinstance(ev, dict):
            raise UsageError(f"{source}: event {i} is {type(ev).__name__}, expected an event object")
        cat, name = ev.get("cat"), str(ev.get("name", ""))
        if ev.get("ph", "X") != "X":
            skipped[f"ph {ev.get('ph')}"] += 1
            continue
        start, end = span_ns(ev, where_of(source, i, name), 0)
        if cat == "Session":
            if name == "model_run":
                runs.append((start, end))
            else:
                skipped[name] += 1
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        if cat != "Node" or "op_name" not in args or \
                (has_kernel_time and not name.endswith("_kernel_time")):
            skipped["fence" if "_fence_" in name else str(cat)] += 1
            continue
        provider = str(args.get("provider") or "onnxruntime")
        providers[provider] += 1
        in_s, in_t = _type_shapes(args.get("input_type_shape"))
        out_s, out_t = _type_shapes(args.get("output_type_shape"))
        node = name[:-len("_kernel_time")] if name.endswith("_kernel_time") else name
        table.add(op=op_for_onnx(str(args["op_name"])), node=node, backend=provider,
                  device=_PROVIDER_DEVICE.get(provider, provider.replace("ExecutionProvider", "").lower()),
                  thread=_int(ev.get("tid", 0)), start_ns=start, end_ns=end, input_shapes=in_s,
                  input_dtypes=in_t, output_shapes=out_s, output_dtypes=out_t)
    check_other_times(doc, source)        # the events skipped above (not X) too
    table.steps_from_spans(runs)
    backend = providers.most_common(1)[0][0] if providers else "onnxruntime"
    steps = len(set(table.cols["step"])) if len(table) else 0
    config = {"format": "onnxruntime", "providers": dict(providers), "skipped": dict(skipped)}
    return table, {"model": "import", "backend": backend, "device": _PROVIDER_DEVICE.get(backend, backend),
                   "steps": steps, "config": config}


def _type_shapes(items):
    """[{"float": [1, 16]}, ...] -> JSON shapes, JSON dtypes."""
    if not isinstance(items, list):
        return None, None
    shapes, dtypes = [], []
    for it in items:
        if isinstance(it, dict) and len(it) == 1:
            (t, s), = it.items()
            shapes.append(s if isinstance(s, list) else [])
            dtypes.append(DTYPES.get(t, t))
    return shapes_json(shapes), shapes_json(dtypes)

