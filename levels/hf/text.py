"""A model directory's text: its tokenizer (``tokenizer.json``) and its chat template."""

from __future__ import annotations

import json
from pathlib import Path


def load_tokenizer(path):
    """The ``tokenizers.Tokenizer`` of ``path / "tokenizer.json"``."""
    from tokenizers import Tokenizer

    file = Path(path) / "tokenizer.json"
    if not file.exists():
        raise FileNotFoundError(
            f"{path} has no tokenizer.json (only the fast-tokenizer file of the `tokenizers` "
            "library is read; a slow tokenizer such as tokenizer.model is not)"
        )
    return Tokenizer.from_file(str(file))


def load_chat_template(path, required: bool = True):
    """The chat template of a model directory (``levels.tokenizer.ChatTemplate``), from
    ``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template`` (the default one
    of a list), with that file's special-token strings. Without one: ``ValueError`` when
    ``required``, else None."""
    from ..tokenizer import ChatTemplate

    path = Path(path)
    config_file = path / "tokenizer_config.json"
    settings = json.loads(config_file.read_text()) if config_file.exists() else {}
    source = settings.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        source = next((t["template"] for t in source if t.get("name") == "default"), None)
    if (path / "chat_template.jinja").exists():
        source = (path / "chat_template.jinja").read_text()
    if not source:
        if not required:
            return None
        raise ValueError(f"{path} has no chat template; use ladder generate for plain text")
    special = {}
    for key, value in settings.items():
        if key.endswith("_token") and value is not None:
            special[key] = value["content"] if isinstance(value, dict) else str(value)
    return ChatTemplate(source, special)
