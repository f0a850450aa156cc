"""Tiny random-weight models for -b auto's tests (tests/test_autoplace.py) and benchmark: transformers' GPT-2, BERT,
Llama, T5 and ViT with two layers (so the search meets repeated blocks), and a scan OpenVINO cannot convert.
Each factory returns (model, inputs), usable as `tests/autoplace_models.py:NAME` on the command line."""
import torch


def _ids(vocab, shape=(2, 16), low=0):
    return torch.randint(low, vocab, shape, generator=torch.Generator().manual_seed(1))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=32, use_cache=False,
                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval(), (_ids(256),)


def bert():
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
                     vocab_size=256, max_position_embeddings=32, attn_implementation="sdpa")
    return BertForMaskedLM(cfg).eval(), (_ids(256),)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=32, use_cache=False)
    return LlamaForCausalLM(cfg).eval(), (_ids(256),)


class _Seq2Seq(torch.nn.Module):
    """T5 given encoder and decoder ids positionally (capture passes inputs by position)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, decoder_ids):
        return self.model(input_ids=ids, decoder_input_ids=decoder_ids).logits


def t5():
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                   decoder_start_token_id=0, pad_token_id=0, use_cache=False)
    return _Seq2Seq(T5ForConditionalGeneration(cfg)).eval(), (_ids(128, low=1), _ids(128, (2, 8), low=1))


def vit():
    from transformers import ViTConfig, ViTForImageClassification
    torch.manual_seed(0)
    cfg = ViTConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128, image_size=32,
                    patch_size=8, num_labels=10, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    return ViTForImageClassification(cfg).eval(), (torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1)),)


class Scan(torch.nn.Module):
    """A log-space running sum between two linears: OpenVINO's importer has no rule for aten::logcumsumexp."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.logcumsumexp(self.a(x).relu(), dim=1)).softmax(-1)


def scan():
    torch.manual_seed(0)
    return Scan().eval(), (torch.randn(2, 5, 8),)


TRANSFORMERS = {"gpt2": gpt2, "bert": bert, "llama": llama, "t5": t5, "vit": vit}
