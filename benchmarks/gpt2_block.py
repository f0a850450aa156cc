"""transformers' GPT-2 at the issue's block size (hidden 256, 4 heads, seq 64, batch 2; 2 layers, random
weights), as a model spec: `python benchmarks/bench_stacks.py --model benchmarks/gpt2_block.py:gpt2`; BERT
(`:bert`) and Llama (`:llama`) at the same size, the other two real models issue 36's benchmark rows name."""
import torch


def gpt2():
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=500, n_positions=64, use_cache=False,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)

    class LastHidden(torch.nn.Module):         # one tensor out: what every side returns
        def __init__(self):
            super().__init__()
            self.gpt2 = GPT2Model(cfg).eval()

        def forward(self, ids):
            return self.gpt2(ids).last_hidden_state
    return LastHidden().eval(), (torch.randint(0, 500, (2, 64)),)


class _LastHidden(torch.nn.Module):
    """One tensor out (the last hidden state): what every side of the benchmark returns."""

    def __init__(self, model):
        super().__init__()
        self.model = model.eval()

    def forward(self, ids):
        return self.model(ids).last_hidden_state


def bert():
    from transformers import BertConfig, BertModel
    cfg = BertConfig(num_hidden_layers=2, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                     vocab_size=500, max_position_embeddings=64, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    return _LastHidden(BertModel(cfg, add_pooling_layer=False)).eval(), (torch.randint(0, 500, (2, 64)),)


def llama():
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=256, intermediate_size=688, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=500, max_position_embeddings=64, use_cache=False)
    torch.manual_seed(0)
    return _LastHidden(LlamaModel(cfg)).eval(), (torch.randint(0, 500, (2, 64)),)
