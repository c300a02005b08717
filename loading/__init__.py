"""Loading: a model source to a model ready to run, and what a run of it needs around it.

* ``models.py``: a source (a known name, a GGUF file, a Hugging Face directory, a trained
  checkpoint) to a model at a level, with its tokenizer, chat template, stop ids and draft
  (``Loaded``); ``LoadError`` when it cannot be as asked;
* ``threads.py``: how many CPU threads a run takes, and why, and the share of a core it gets;
* ``slow.py``: what a model costs at the rungs that take seconds a token;
* ``compiles.py``: level 3's compiled passes prepared before a first answer, announced
  before a compile, remembered after.

The commands (``ladder chat``, ``generate``, ``serve``) and the bench load through here.
"""

from .compiles import prepare, prepare_all
from .models import (
    DEFAULT_CONTEXT,
    Loaded,
    LoadError,
    build,
    default_dtype,
    load,
    source,
)
from .threads import Threads, choose, cpu_threads, free_cores

__all__ = [
    "DEFAULT_CONTEXT",
    "LoadError",
    "Loaded",
    "Threads",
    "build",
    "choose",
    "cpu_threads",
    "default_dtype",
    "free_cores",
    "load",
    "prepare",
    "prepare_all",
    "source",
]
