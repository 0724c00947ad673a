"""Write a tiny random-weight model in the layout ``mlx_lm.load`` reads (test code: the oMLX
stand-in serves it). Deterministic from the seed. Nothing is downloaded.

``python tiny_mlx_model.py TARGET SEED`` writes a Llama (hidden size 64, 2 layers, 2 heads);
``python tiny_mlx_model.py TARGET SEED moe`` writes a DeepSeek-V3 mixture of experts (2 MoE
layers of 4 routed experts and a shared one, 2 per token), affine-quantised to 4 bits by MLX
(``nn.quantize``, group size 32: the experts are stacked ``switch_mlp`` tensors), split in two
shards with ``model.safetensors.index.json``, which the expert adapter slices. Both use a
byte-level tokenizer (256 byte tokens, no merges) with ``<s>``, ``</s>``, ``<|im_start|>``,
``<|im_end|>`` built locally with ``tokenizers``, and a ChatML chat template.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def _tokenizer(target: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: index for index, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="<|im_end|>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(target))
    return {token: int(core.token_to_id(token)) for token in SPECIALS} | {
        "vocab": core.get_vocab_size()
    }


def write_moe(target: Path, seed: int) -> None:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models import deepseek_v3

    target.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(target)
    config: dict[str, object] = {
        "model_type": "deepseek_v3", "vocab_size": ids["vocab"], "hidden_size": 64,
        "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 2, "n_shared_experts": 1,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "kv_lora_rank": 32, "q_lora_rank": 32,
        "qk_rope_head_dim": 16, "v_head_dim": 32, "qk_nope_head_dim": 32, "n_group": 1,
        "topk_group": 1, "first_k_dense_replace": 0, "max_position_embeddings": 2048,
    }  # fmt: skip
    mx.random.seed(seed)
    model = deepseek_v3.Model(deepseek_v3.ModelArgs(**config))  # type: ignore[arg-type]
    nn.quantize(model, group_size=32, bits=4)
    weights = dict(sorted(tree_flatten(model.parameters())))
    shards: dict[str, dict[str, object]] = {"model-00001-of-00002.safetensors": {},
                                            "model-00002-of-00002.safetensors": {}}  # fmt: skip
    for key, value in weights.items():
        second = key.startswith("model.layers.1.")
        shards[f"model-0000{2 if second else 1}-of-00002.safetensors"][key] = value
    weight_map = {}
    for name, tensors in shards.items():
        mx.save_safetensors(str(target / name), tensors)  # type: ignore[arg-type]
        weight_map.update({key: name for key in tensors})
    index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
    (target / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    config["quantization"] = {"group_size": 32, "bits": 4}
    config["eos_token_id"] = ids["<|im_end|>"]
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write(target: Path, seed: int) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    target.mkdir(parents=True, exist_ok=True)
    ids = _tokenizer(target)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": ids["vocab"],
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
        "bos_token_id": ids["<s>"],
        "eos_token_id": ids["<|im_end|>"],
        "torch_dtype": "float32",
    }
    mx.random.seed(seed)
    args = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    args.pop("bos_token_id")
    args.pop("eos_token_id")
    model = llama.Model(llama.ModelArgs(**args))
    weights = dict(sorted(tree_flatten(model.parameters())))
    mx.save_safetensors(str(target / "model.safetensors"), weights)
    (target / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    writer = write_moe if sys.argv[3:] == ["moe"] else write
    writer(Path(sys.argv[1]), int(sys.argv[2]))
