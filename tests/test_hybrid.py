"""HybridStrategy (the seed's vocabulary): a batch split across backends by ratio."""
import numpy as np
import pytest
import torch

from opscope.runtime import models
from opscope.runtime.errors import UsageError
from opscope.runtime.hybrid import HybridStrategy, run_hybrid
from opscope.runtime.session import compare


def test_split_places_every_row_once_by_ratio_and_respects_the_threshold():
    s = HybridStrategy(gpu_ratio=0.7, npu_ratio=0.3, switch_threshold=1000, gpu="torch:cpu")
    assert s.split(8, 128) == [("torch:cpu", 8)]                   # short sequence: no split
    assert s.split(8, 1000) == [("torch:cpu", 6), ("sim:npu-a1", 2)]
    assert sum(n for _, n in s.split(7, 4096)) == 7
    assert HybridStrategy(ratios={"a": 0.5, "b": 0.5}).split(3, 0) in ([("a", 2), ("b", 1)], [("a", 1), ("b", 2)])


def test_hybrid_run_matches_eager_and_reports_each_share():
    model, _ = models.load("demo:gpt")
    inputs = (torch.randint(0, 2048, (4, 32)),)
    result = run_hybrid(model, inputs, HybridStrategy(ratios={"torch:cpu": 0.5, "sim:npu-a1": 0.5}))
    with torch.no_grad():
        expected = model(*inputs).numpy()
    assert compare(result.outputs, [expected])["max_abs"] <= 1e-4
    assert [(s["backend"], s["rows"]) for s in result.shares] == [("torch:cpu", 2), ("sim:npu-a1", 2)]
    assert result.shares[1]["fallback_ops"] == ["gelu"]                # npu-a1 has no gelu
    assert result.step_seconds == max(s["seconds"] for s in result.shares) > 0


@pytest.mark.parametrize("text", ["torch:cpu", "torch:cpu=x", "=0.5", "a=-1,b=1", "a=nan", "a=inf,b=1", ",",
                                  "a=0.7,b=0.5", "a=1,b=1", "a=0.5", "a=0.3333,b=0.3333,c=0.3333"])
def test_bad_hybrid_specs_are_usage_errors(text):
    with pytest.raises(UsageError):
        HybridStrategy.parse(text)


def test_hybrid_run_needs_tensor_inputs_with_a_batch_dim():
    with pytest.raises(UsageError, match="dim 0"):
        run_hybrid(torch.nn.Identity(), (3,), HybridStrategy.parse("numpy=1"))


def test_factory_whose_inputs_are_not_a_tuple_is_a_usage_error(tmp_path):
    (tmp_path / "net.py").write_text("import torch\ndef f():\n    return torch.nn.Linear(2, 2), 5\n")
    with pytest.raises(UsageError, match="example inputs of type int"):
        models.load(f"{tmp_path}/net.py:f")


def test_cli_hybrid(cli):
    r = cli("run", "demo:mlp", "--hybrid", "numpy=0.5,torch:cpu=0.5", "--json")
    assert r.returncode == 0, r.stderr
    import json
    doc = json.loads(r.stdout)
    assert doc["max_abs_err"] <= 1e-4 and len(doc["shares"]) == 2
    bad = cli("run", "demo:mlp", "--hybrid", "nope=1")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_shares_are_normalised_only_when_they_sum_to_one_within_1e6():
    s = HybridStrategy.parse(f"a={1 / 3},b={1 / 3},c={1 / 3 + 4e-7}")
    assert abs(sum(s.ratios.values()) - 1.0) < 1e-12
    with pytest.raises(UsageError, match="sum to 1.2"):
        HybridStrategy(ratios={"torch:cpu": 0.7, "sim:npu-a1": 0.5})
    with pytest.raises(UsageError, match="sum to"):
        HybridStrategy(ratios={"a": 0.5, "b": 0.5 + 2e-6})


def test_a_split_that_cannot_honour_the_ratios_says_what_it_did():
    s = HybridStrategy.parse("torch:cpu=0.7,sim:npu-a1=0.3")
    assert s.split(2, 0) == [("torch:cpu", 1), ("sim:npu-a1", 1)]
    assert s.split_note(2, 0) == ("a batch of 2 rows splits in whole rows: 1/1 rows (0.50/0.50) for shares "
                                  "0.70/0.30")
    assert s.split_note(10, 0) is None                              # 7/3 is exact
    assert "cannot be split" in s.split_note(1, 0)
    assert "shorter than the switch threshold" in HybridStrategy.parse("a=0.5,b=0.5", 64).split_note(4, 8)
    model = torch.nn.Linear(4, 4)
    result = run_hybrid(model, (torch.randn(2, 4),), s)
    assert result.note == s.split_note(2, 0) and [x["rows"] for x in result.shares] == [1, 1]
