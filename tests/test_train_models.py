"""`opscope train` on real model families (transformers, random weights, small configs): 10 steps on numpy,
torch:cpu and a sim backend match eager PyTorch (loss per step, every parameter after step 10) within 1e-4."""
import pytest
import torch

from opscope.runtime.train import OptimizerSpec, compare_with_eager

transformers = pytest.importorskip("transformers")
TOL = 1e-4


def gpt2():
    cfg = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=16,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    return transformers.GPT2LMHeadModel(cfg), (ids, None, None, None, None, None, None, None, ids)


def bert():
    cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=2, hidden_size=32, intermediate_size=64,
                                  vocab_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    return transformers.BertForMaskedLM(cfg), (ids, None, None, None, None, None, None, None, None, ids)


def resnet18():
    cfg = transformers.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[2, 2, 2, 2],
                                    layer_type="basic", num_labels=4)
    torch.manual_seed(0)
    return transformers.ResNetForImageClassification(cfg), (torch.randn(32, 3, 32, 32), torch.randint(0, 4, (32,)))


# NOTE: ResNet training on a few images is chaotic at the default rates (sgd 1e-2, adamw 1e-3): eager PyTorch
# against itself, with the initial weights perturbed by 1e-7, drifts up to 1e-2 in 10 steps (measured at batch
# 2-32) -- ReLU / max-pool routing flips on activations within rounding of a tie, and batch norm over 2 values
# at batch 2 (1x1 last stage) amplifies rounding 300x. So float32 rounding alone (numpy's kernels sum in another
# order than ATen's) fails 1e-4 there. At batch 32 and 10x lower rates eager-vs-perturbed-eager stays ~1e-6,
# so 1e-4 here measures the backend, not the model's conditioning.
LR = {"resnet18": {"sgd": 1e-3, "adamw": 1e-4}}


def _kwargs_model(factory):
    """transformers models take labels by keyword: a wrapper that takes them positionally."""
    model, args = factory()

    class ByKeyword(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, labels):
            return self.model(x, labels=labels)
    torch.manual_seed(0)
    return ByKeyword().train(), (args[0], args[-1])


@pytest.mark.slow
@pytest.mark.parametrize("factory", [gpt2, bert, resnet18], ids=["gpt2", "bert", "resnet18"])
@pytest.mark.parametrize("backend", ["numpy", "torch:cpu", "sim:npu-a1"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_transformers_model_trains_like_eager(factory, backend, optimizer):
    model, inputs = _kwargs_model(factory)
    lr = LR.get(factory.__name__, {}).get(optimizer, 1e-2 if optimizer == "sgd" else 1e-3)
    opt = OptimizerSpec(optimizer, lr=lr, weight_decay=0.01)
    r = compare_with_eager(factory.__name__, backend, steps=10, optimizer=opt, model=model, inputs=inputs)
    for a, e in zip(r["losses"], r["eager_losses"]):
        assert abs(a - e) <= TOL * max(1.0, abs(e)), (r["losses"], r["eager_losses"])
    assert r["parameter_error"]["max_abs"] <= TOL, r["parameter_error"]
    # batch-norm running statistics never reach a training-mode loss: only comparing them shows them carried
    assert r["buffer_error"]["max_abs"] <= TOL, r["buffer_error"]
    assert r["losses"][-1] < r["losses"][0]


@pytest.mark.slow
@pytest.mark.parametrize("factory,tied", [(gpt2, "model.lm_head.weight"), (bert, "model.cls.predictions.decoder.bias")],
                         ids=["gpt2", "bert"])
def test_a_tied_weight_is_one_parameter_updated_once(factory, tied):
    from opscope.runtime import backends
    from opscope.runtime.train import Trainer

    model, inputs = _kwargs_model(factory)
    t = Trainer.create(model, inputs, backends.resolve("numpy"), OptimizerSpec("sgd"))
    first = t.train.joint.aliases[tied]
    assert tied not in t.train.joint.param_slots and first in t.train.joint.grad_slots
    assert sum(1 for n in t.train.graph.nodes if n.op == "sgd" and n.attrs["param"] == first) == 1
    t.step()
    params = t.parameters()
    assert (params[tied] == params[first]).all()          # every name reads the one updated tensor


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_resnet_config_is_well_conditioned(optimizer):
    """The NOTE above, checked: eager against eager with the weights perturbed by 1e-7 stays well inside the
    tolerance, so a failure of the ResNet case above is the backend's, not rounding amplified by the model."""
    import copy

    from opscope.runtime.train import eager_steps

    model, inputs = _kwargs_model(resnet18)
    opt = OptimizerSpec(optimizer, lr=LR["resnet18"][optimizer], weight_decay=0.01)
    nudged = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in nudged.parameters():
            p.mul_(1 + 1e-7 * torch.randn(p.shape, generator=g))
    a, b = eager_steps(model, inputs, opt, 10), eager_steps(nudged, inputs, opt, 10)
    drift = max(float(abs(a["parameters"][k] - b["parameters"][k]).max()) for k in a["parameters"])
    assert drift <= TOL / 10, drift


# --- families that need the view, activation and softmax backwards (issue 26) -------------------------------
# 3 steps of SGD and AdamW on numpy and a sim chip, no op sent to torch: loss and every parameter within 1e-4.
def llama():
    cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=64, max_position_embeddings=32, use_cache=False)
    torch.manual_seed(0)
    ids = torch.randint(0, 64, (2, 8))
    return transformers.LlamaForCausalLM(cfg), (ids, ids)       # rotary halves: slice_backward


def vit():
    cfg = transformers.ViTConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                 image_size=16, patch_size=4, num_labels=3, hidden_dropout_prob=0.0,
                                 attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.ViTForImageClassification(cfg), (torch.randn(2, 3, 16, 16), torch.randint(0, 3, (2,)))


def roberta():
    cfg = transformers.RobertaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                     vocab_size=64, max_position_embeddings=20, num_labels=3, hidden_dropout_prob=0.0,
                                     attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    return transformers.RobertaForSequenceClassification(cfg), (torch.randint(3, 64, (2, 8)), torch.randint(0, 3, (2,)))


def _vision(name):
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("mobilenet", Path(__file__).parent / "models" / "mobilenet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)()


def mobilenet_v3():
    return _vision("mobilenet_v3")


def convnext():
    return _vision("convnext")


def _three_steps(factory, backend, optimizer):
    if factory in (mobilenet_v3, convnext):
        model, inputs = factory()
    else:
        model, inputs = _kwargs_model(factory)
    opt = OptimizerSpec(optimizer, lr=1e-2 if optimizer == "sgd" else 1e-3, weight_decay=0.01)
    return compare_with_eager(factory.__name__, backend, steps=3, optimizer=opt, model=model, inputs=inputs)


def _assert_like_eager(r):
    for a, e in zip(r["losses"], r["eager_losses"]):
        assert abs(a - e) <= TOL * max(1.0, abs(e)), (r["losses"], r["eager_losses"])
    assert r["parameter_error"]["max_abs"] <= TOL, r["parameter_error"]
    assert r["buffer_error"]["max_abs"] <= TOL, r["buffer_error"]
    # the chip's own fallback (numpy) may take what it lacks (gelu, cumsum); torch may not
    assert not [f for f in r["placement"]["fallback_ops"] if f["backend"].startswith("torch")], r["placement"]


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_mobilenet_v3_style_trains_on_numpy_like_eager(optimizer):
    """hardswish / hardsigmoid (forward and backward), depthwise convolutions, squeeze-excite, batch norm."""
    _assert_like_eager(_three_steps(mobilenet_v3, "numpy", optimizer))


# SGD and AdamW on numpy and on the sim chip (issue 26's sweep)
@pytest.mark.slow
@pytest.mark.parametrize("factory", [llama, vit, roberta, mobilenet_v3, convnext],
                         ids=["llama", "vit", "roberta", "mobilenet_v3", "convnext"])
@pytest.mark.parametrize("backend,optimizer", [("numpy", "sgd"), ("numpy", "adamw"), ("sim:npu-a1", "sgd"),
                                               ("sim:npu-a1", "adamw")])
def test_architecture_trains_three_steps_like_eager(factory, backend, optimizer):
    if factory is mobilenet_v3 and backend == "numpy":
        pytest.skip("the fast test above")
    _assert_like_eager(_three_steps(factory, backend, optimizer))
