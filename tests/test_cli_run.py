"""`opscope run` through the command line: results match eager PyTorch; bad input is exit 2, one line."""
import json
import textwrap

import pytest

USER_MODEL = textwrap.dedent("""
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(4, 8, 3, padding=1)
            self.norm = nn.LayerNorm(16)
            self.head = nn.Linear(16, 5)

        def forward(self, x, mask):
            y = torch.tanh(self.norm(self.conv(x)))
            y = y.masked_fill(~mask[:, None, :], 0.0)
            return self.head(y).softmax(-1), y.mean(dim=(1, 2))

    def factory():
        torch.manual_seed(0)
        mask = torch.ones(2, 16, dtype=torch.bool)
        mask[1, 10:] = False
        return Net().eval(), (torch.randn(2, 4, 16), mask)

    def broken():
        raise RuntimeError("weights not found")
""")


def _run_json(cli, *args):
    r = cli("run", *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("model, backend", [("demo:mlp", "numpy"), ("demo:cnn", "torch:cpu"), ("demo:gpt", "sim:npu-a1")])
def test_run_demo_matches_eager(cli, model, backend):
    doc = _run_json(cli, model, "--backend", backend)
    assert doc["max_abs_err"] <= 1e-4 and doc["backend"] == backend
    assert sum(doc["placement"]["nodes_per_backend"].values()) == doc["nodes"]
    assert doc["memory"]["peak_bytes"] > 0


def test_run_reports_fallback_ops_by_name(cli):
    doc = _run_json(cli, "demo:gpt", "--backend", "sim:npu-a1")
    fell = {f["op"]: f for f in doc["placement"]["fallback_ops"]}
    assert set(fell) == {"gelu"} and fell["gelu"]["nodes"] == 4 and fell["gelu"]["backend"] == "numpy"
    assert doc["placement"]["transfer_bytes"] > 0


@pytest.mark.parametrize("backend", ["numpy", "torch:cpu", "sim:edge-gpu"])
def test_run_user_model_file(cli, tmp_path, backend):
    f = tmp_path / "net.py"
    f.write_text(USER_MODEL)
    doc = _run_json(cli, f"{f}:factory", "-b", backend)
    assert doc["max_abs_err"] <= 1e-4


def _bad(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


MALFORMED = {
    "unknown key": ('[backend]\nname = "x"\nimplementation = "sim"\ncolour = "red"\n', "backend.colour"),
    "wrong type": ('[backend]\nname = 3\nimplementation = "sim"\n', "backend.name"),
    "missing key": ('[backend]\nname = "x"\n', "backend.implementation"),
}


@pytest.mark.parametrize("case", ["unknown model", "factory raises", "unknown backend", "missing file", "no factory",
                                  *MALFORMED])
def test_bad_input_is_exit_2_and_one_line(cli, tmp_path, case):
    model, backend, want = "demo:mlp", "numpy", ""
    if case == "unknown model":
        model, want = "demo:nope", "demo:nope"
    elif case == "factory raises":
        model, want = f"{_bad(tmp_path, 'net.py', USER_MODEL)}:broken", "weights not found"
    elif case == "unknown backend":
        backend, want = "tpu:7", "tpu:7"
    elif case == "missing file":
        model, want = f"{tmp_path}/missing.py:factory", "missing.py"
    elif case == "no factory":
        model, want = f"{_bad(tmp_path, 'net.py', USER_MODEL)}:nothing", "nothing"
    else:
        text, key = MALFORMED[case]
        backend = _bad(tmp_path, "chip.toml", text)
        want = key
    r = cli("run", model, "--backend", backend)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert want in lines[0], lines[0]
    if case in MALFORMED:
        assert "chip.toml" in lines[0]


def test_no_fallback_lists_every_unsupported_op_at_once(cli, tmp_path):
    chip = _bad(tmp_path, "chip.toml", '[backend]\nname = "x"\nimplementation = "sim"\nfallback = "numpy"\n'
                '[hardware]\npeak_flops = { float32 = 1.0e12 }\nmemory_bandwidth = 1.0e11\n'
                '[operators]\nunsupported = ["gelu", "layer_norm", "embedding"]\n')
    r = cli("run", "demo:gpt", "--backend", chip, "--no-fallback")
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and all(op in lines[0] for op in ("gelu", "layer_norm", "embedding")), r.stderr


@pytest.mark.parametrize("flags", [["--repeat", "0"], ["--hybrid", "numpy=1", "--switch-threshold", "-1"]])
def test_run_rejects_counts_below_their_minimum(cli, flags):
    r = cli("run", "demo:mlp", "-b", "numpy", *flags)
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
