"""The model matrix of issue 36: twelve architectures users bring (transformers' with tiny random-weight configs,
plus an LSTM and a UNet), each a factory returning (model, inputs) -- `FORWARD` for inference (eval mode),
`TRAINING` for `opscope train` (the loss first, labels by keyword, dropout off so eager and the stacks agree).

    model, inputs = FORWARD["llama"]()

GPT-2, BERT, Llama, T5 and ViT take a Size: the matrix's one layer by default, or -b auto's two layers
(tests/autoplace_models.py), one factory for both.
"""
from dataclasses import dataclass

import torch
from torch import nn

from train_sweep import by_keyword


def _ids(vocab, shape=(2, 8), low=0):
    return torch.randint(low, vocab, shape, generator=torch.Generator().manual_seed(1))


@dataclass(frozen=True)
class Size:
    """How big the transformers models are. Feed-forward widths are twice `hidden`, position tables twice `seq`
    (Llama's 32), T5's vocabulary twice `hidden`; images are cut in 8x8 patches."""
    layers: int = 1
    hidden: int = 32
    heads: int = 2
    vocab: int = 100
    seq: int = 8              # tokens per sequence (batch 2)
    decoder_seq: int = 6      # T5's decoder tokens
    image: int = 16           # ViT's image side
    labels: int = 3           # ViT's classes


SMALL = Size()


def gpt2(size: Size = SMALL):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=size.layers, n_embd=size.hidden, n_head=size.heads, vocab_size=size.vocab,
                     n_positions=2 * size.seq, use_cache=False, bos_token_id=0, eos_token_id=0,
                     attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval(), (_ids(size.vocab, (2, size.seq)),)


def bert(size: Size = SMALL):
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=size.layers, hidden_size=size.hidden, num_attention_heads=size.heads,
                     intermediate_size=2 * size.hidden, vocab_size=size.vocab, max_position_embeddings=2 * size.seq,
                     attn_implementation="sdpa")
    return BertForMaskedLM(cfg).eval(), (_ids(size.vocab, (2, size.seq)),)


def _llama_config(size: Size = SMALL):
    from transformers import LlamaConfig
    return LlamaConfig(num_hidden_layers=size.layers, hidden_size=size.hidden, intermediate_size=2 * size.hidden,
                       num_attention_heads=4, num_key_value_heads=2, vocab_size=size.vocab, max_position_embeddings=32,
                       use_cache=False)


def llama(size: Size = SMALL):
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(_llama_config(size)).eval(), (_ids(size.vocab, (2, size.seq)),)


def _t5_config(size: Size = SMALL):
    from transformers import T5Config
    return T5Config(vocab_size=2 * size.hidden, d_model=size.hidden, d_kv=16, d_ff=2 * size.hidden,
                    num_layers=size.layers, num_decoder_layers=size.layers, num_heads=size.heads,
                    relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                    decoder_start_token_id=0, pad_token_id=0, use_cache=False)


class _Seq2Seq(nn.Module):
    """T5 given encoder and decoder ids positionally (capture passes inputs by position)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, decoder_ids):
        return self.model(input_ids=ids, decoder_input_ids=decoder_ids).logits


def t5(size: Size = SMALL):
    from transformers import T5ForConditionalGeneration
    torch.manual_seed(0)
    vocab = 2 * size.hidden
    return (_Seq2Seq(T5ForConditionalGeneration(_t5_config(size))).eval(),
            (_ids(vocab, (2, size.seq), low=1), _ids(vocab, (2, size.decoder_seq), low=1)))


def mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM
    torch.manual_seed(0)
    cfg = MixtralConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                        num_key_value_heads=2, vocab_size=100, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=32, use_cache=False)
    return MixtralForCausalLM(cfg).eval(), (_ids(100),)


def _roberta_config():
    from transformers import RobertaConfig
    return RobertaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                         vocab_size=64, max_position_embeddings=20, num_labels=3, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0)


def roberta():
    from transformers import RobertaForSequenceClassification
    torch.manual_seed(0)
    return RobertaForSequenceClassification(_roberta_config()).eval(), (_ids(64, low=3),)


def whisper_encoder():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder
    torch.manual_seed(0)
    cfg = WhisperConfig(num_mel_bins=8, encoder_layers=1, d_model=32, encoder_attention_heads=2, encoder_ffn_dim=64,
                        max_source_positions=8)
    return WhisperEncoder(cfg).eval(), (torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)),)


def _wav2vec2_config(**kwargs):
    from transformers import Wav2Vec2Config
    return Wav2Vec2Config(vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                          intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3),
                          num_feat_extract_layers=2, feat_extract_norm="group", num_conv_pos_embeddings=8,
                          num_conv_pos_embedding_groups=4, hidden_dropout=0.0, activation_dropout=0.0,
                          attention_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0,
                          num_labels=3, classifier_proj_size=16, **kwargs)


def wav2vec2():
    from transformers import Wav2Vec2Model
    torch.manual_seed(0)
    return Wav2Vec2Model(_wav2vec2_config()).eval(), (torch.randn(2, 400, generator=torch.Generator().manual_seed(1)),)


def _vit_config(size: Size = SMALL):
    from transformers import ViTConfig
    return ViTConfig(num_hidden_layers=size.layers, hidden_size=size.hidden, num_attention_heads=size.heads,
                     intermediate_size=2 * size.hidden, image_size=size.image, patch_size=8, num_labels=size.labels,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def vit(size: Size = SMALL):
    from transformers import ViTForImageClassification
    torch.manual_seed(0)
    return (ViTForImageClassification(_vit_config(size)).eval(),
            (torch.randn(2, 3, size.image, size.image, generator=torch.Generator().manual_seed(1)),))


def swin():
    from transformers import SwinConfig, SwinForImageClassification
    torch.manual_seed(0)
    cfg = SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
                     num_labels=3)
    image = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    return SwinForImageClassification(cfg).eval(), (image,)


def lstm():
    from models.recurrent import lstm
    return lstm()


def unet():
    """The in-place UNet (relu_, +=, /=, a boolean &, a fill_ through views): what real UNets are written like."""
    from models.unet import in_place_factory
    return in_place_factory()


FORWARD = {"gpt2": gpt2, "bert": bert, "llama": llama, "t5": t5, "mixtral": mixtral, "roberta": roberta,
           "whisper_encoder": whisper_encoder, "wav2vec2": wav2vec2, "vit": vit, "swin": swin, "lstm": lstm,
           "unet": unet}


# --- training: the loss is the model's first output ---------------------------------------------------------
def llama_train():
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    ids = _ids(100)
    return by_keyword(LlamaForCausalLM(_llama_config()), ids, ids)


def vit_train():
    from transformers import ViTForImageClassification
    torch.manual_seed(0)
    return by_keyword(ViTForImageClassification(_vit_config()),
                      torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 2]))


def roberta_train():
    from transformers import RobertaForSequenceClassification
    torch.manual_seed(0)
    return by_keyword(RobertaForSequenceClassification(_roberta_config()), _ids(64, low=3), torch.tensor([0, 2]))


def t5_train():
    from transformers import T5ForConditionalGeneration
    torch.manual_seed(0)
    return by_keyword(T5ForConditionalGeneration(_t5_config()), _ids(64, low=1), _ids(64, (2, 6), low=1))


def wav2vec2_train():
    """transformers' default SpecAugment (mask_time_prob=0.05): a random draw and boolean indexing in training."""
    from transformers import Wav2Vec2ForSequenceClassification
    torch.manual_seed(0)
    return by_keyword(Wav2Vec2ForSequenceClassification(_wav2vec2_config()),
                      torch.randn(2, 400, generator=torch.Generator().manual_seed(1)), torch.tensor([0, 2]))


TRAINING = {"llama": llama_train, "vit": vit_train, "roberta": roberta_train, "t5": t5_train,
            "wav2vec2": wav2vec2_train}
