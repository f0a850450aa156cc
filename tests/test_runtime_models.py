"""Models people actually use (random weights, small configs): GPT-2, BERT and ResNet-18 from
transformers, given as `file.py:factory`, on every kind of backend.

NOTE: ResNet-18 comes from transformers (microsoft/resnet-18's architecture), not timm: timm needs
torchvision, and PyPI's torchvision does not load beside the CPU build of torch 2.13 that CI pins."""
import textwrap

import pytest

from opscope.runtime import open_session
from opscope.runtime.session import compare

FACTORIES = textwrap.dedent("""
    import torch

    def gpt2():
        from transformers import GPT2Config, GPT2Model
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500, n_positions=64, use_cache=False,
                         bos_token_id=0, eos_token_id=0)
        return GPT2Model(cfg).eval(), (torch.randint(0, 500, (2, 16)),)

    def bert():
        from transformers import BertConfig, BertModel
        torch.manual_seed(0)
        cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                         vocab_size=500, max_position_embeddings=64)
        ids = torch.randint(0, 500, (2, 16))
        mask = torch.ones(2, 16, dtype=torch.long)
        mask[1, 10:] = 0
        return BertModel(cfg).eval(), (ids, mask)

    def resnet18():
        from transformers import ResNetConfig, ResNetForImageClassification
        torch.manual_seed(0)
        cfg = ResNetConfig(embedding_size=64, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2],
                           layer_type="basic", num_labels=10)
        return ResNetForImageClassification(cfg).eval(), (torch.randn(2, 3, 64, 64),)
""")


@pytest.fixture(scope="module")
def factories(tmp_path_factory):
    p = tmp_path_factory.mktemp("models") / "zoo.py"
    p.write_text(FACTORIES)
    return p


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["numpy", "torch:cpu", "sim:npu-a1"])
@pytest.mark.parametrize("factory", ["gpt2", "bert", "resnet18"])
def test_library_model_matches_eager(factories, factory, backend):
    pytest.importorskip("transformers")
    s = open_session(f"{factories}:{factory}", backend)
    assert not any(n.op.startswith("aten:") for n in s.graph.nodes) or backend.startswith("torch")
    err = compare(s.run_host(), s.eager())
    assert err["max_abs"] <= 1e-4, err
