"""Classification heads fitted from aggregated statistics, and their registry."""

from ghofl.heads.base import Head
from ghofl.heads.registry import (
    available_heads,
    head_class,
    load_head,
    make_head,
    parse_head_list,
    register_head,
    save_head,
)

__all__ = [
    "Head",
    "available_heads",
    "head_class",
    "load_head",
    "make_head",
    "parse_head_list",
    "register_head",
    "save_head",
]
