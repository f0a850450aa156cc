"""The model matrix of issue 36: twelve architectures users bring (transformers' with tiny random-weight configs,
plus an LSTM and a UNet), each a factory returning (model, inputs) -- `FORWARD` for inference (eval mode),
`TRAINING` for `opscope train` (the loss first, labels by keyword, dropout off so eager and the stacks agree).

    model, inputs = FORWARD["llama"]()
"""
import torch
from torch import nn

from train_sweep import by_keyword


def _ids(vocab, shape=(2, 8), low=0):
    return torch.randint(low, vocab, shape, generator=torch.Generator().manual_seed(1))


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=16, use_cache=False,
                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa")
    return GPT2LMHeadModel(cfg).eval(), (_ids(100),)


def bert():
    from transformers import BertConfig, BertForMaskedLM
    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, max_position_embeddings=16, attn_implementation="sdpa")
    return BertForMaskedLM(cfg).eval(), (_ids(100),)


def _llama_config():
    from transformers import LlamaConfig
    return LlamaConfig(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=100, max_position_embeddings=32, use_cache=False)


def llama():
    from transformers import LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(_llama_config()).eval(), (_ids(100),)


def _t5_config():
    from transformers import T5Config
    return T5Config(vocab_size=64, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2,
                    relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                    decoder_start_token_id=0, pad_token_id=0, use_cache=False)


class _Seq2Seq(nn.Module):
    """T5 given encoder and decoder ids positionally (capture passes inputs by position)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, decoder_ids):
        return self.model(input_ids=ids, decoder_input_ids=decoder_ids).logits


def t5():
    from transformers import T5ForConditionalGeneration
    torch.manual_seed(0)
    return _Seq2Seq(T5ForConditionalGeneration(_t5_config())).eval(), (_ids(64, low=1), _ids(64, (2, 6), low=1))


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


def _vit_config():
    from transformers import ViTConfig
    return ViTConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, intermediate_size=64, image_size=16,
                     patch_size=8, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def vit():
    from transformers import ViTForImageClassification
    torch.manual_seed(0)
    return (ViTForImageClassification(_vit_config()).eval(),
            (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),))


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
