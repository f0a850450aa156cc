"""Model specs: `demo:NAME` or `path/to/file.py:factory` -> (model, example_inputs)."""
from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import torch

from .errors import UsageError, first_line
from .specs import DEMOS, check_model_spec  # noqa: F401  (DEMOS re-exported)


def load(spec: str) -> tuple[torch.nn.Module, tuple]:
    """(model, example inputs) for a model spec: `demo:mlp|cnn|gpt` (seeded random weights, no download) or
    `path/to/file.py:factory`, where factory() returns (model, inputs)."""
    spec = check_model_spec(spec)
    if spec.startswith("demo:"):
        module = importlib.import_module(f"opscope.runtime.demos.{spec[5:]}")
        return _call(module.factory, spec)
    path, _, attr = spec.rpartition(":")
    file = Path(path)
    mod_name = f"opscope_user_{abs(hash(str(file.resolve())))}"
    try:
        module_spec = importlib.util.spec_from_file_location(mod_name, file)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise UsageError(f"importing {path} failed: {type(e).__name__}: {first_line(e)}") from e
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise UsageError(f"{path} has no function {attr!r}: define {attr}() returning (model, example_inputs)")
    return _call(factory, spec)


def load_train(spec: str) -> tuple[torch.nn.Module, tuple]:
    """(model that returns its loss, inputs) for training: a demo's training form (its loss on
    seeded synthetic targets), or a user factory whose model already returns the loss."""
    spec = (spec or "").strip()
    if spec.startswith("demo:") and spec[5:] in DEMOS:
        module = importlib.import_module(f"opscope.runtime.demos.{spec[5:]}")
        model, inputs = _call(module.train_factory, spec)
    else:
        model, inputs = load(spec)
    return model.train(), inputs


def _call(factory, spec):
    try:
        result = factory()
    except Exception as e:
        raise UsageError(f"model factory {spec} raised {type(e).__name__}: {first_line(e)}") from e
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], torch.nn.Module)):
        raise UsageError(f"model factory {spec} must return (nn.Module, example_inputs_tuple), got {type(result).__name__}")
    model, inputs = result
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)):
        raise UsageError(f"model factory {spec} must return (nn.Module, example_inputs_tuple); got example inputs "
                         f"of type {type(inputs).__name__}")
    return model.eval(), tuple(inputs)
