"""Named variants of one architecture class (ResNet18 = ResNet with fixed blocks)."""
from __future__ import annotations


def variant(variant_name: str, cls, doc: str = "", **fixed):
    """A factory ``variant_name(**kw)`` that builds ``cls(**fixed, **kw)``; ``builds``
    and ``fixed`` let the registry list the options a caller may still set."""
    def make(**kw):
        return cls(**fixed, **kw)
    make.__name__ = make.__qualname__ = variant_name
    make.__doc__ = doc or f"{cls.__name__} with {fixed}"
    make.builds, make.fixed = cls, tuple(fixed)
    return make
