"""transformers' GPT-2 at the issue's block size (hidden 256, 4 heads, seq 64, batch 2; 2 layers, random
weights), as a model spec: `python benchmarks/bench_stacks.py --model benchmarks/gpt2_block.py:gpt2`."""
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
