"""Give the architecture (``pieces.py``, ``models.py``) one level's arithmetic.

``bind(ops, convert, module_name)`` makes the level's classes: subclasses of
the architecture classes that only set ``ops`` (the array primitives),
``convert`` (the numpy converters) and ``classes`` (this same namespace, so a
block builds children of its own level). Level 0 binds its loops, level 1
its numpy functions; nothing above the arithmetic is written twice.
"""

from __future__ import annotations

from types import ModuleType, SimpleNamespace

from . import models, pieces

ARCHITECTURE = (
    pieces.LayerNorm,
    pieces.FeedForward,
    pieces.MultiHeadAttention,
    pieces.EncoderLayer,
    pieces.DecoderLayer,
    models.DecoderOnlyTransformer,
    models.Seq2SeqTransformer,
)


INTERFACE = tuple(cls.__name__ for cls in ARCHITECTURE)


def bind(ops: ModuleType, convert: ModuleType, module_name: str) -> dict[str, type]:
    """The classes of ``ARCHITECTURE`` computing with ``ops``, named as members of ``module_name``.

    Returns ``{name: class}``; a level's ``__init__`` puts them in its namespace.
    """
    classes = SimpleNamespace()
    for base in ARCHITECTURE:
        bound = type(
            base.__name__,
            (base,),
            {
                "ops": ops,
                "convert": convert,
                "classes": classes,
                "__module__": module_name,
                "__qualname__": base.__name__,
                "__doc__": base.__doc__,
            },
        )
        setattr(classes, base.__name__, bound)
    return dict(vars(classes))
