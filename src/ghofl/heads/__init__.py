"""Classification heads fitted from aggregated statistics, and their registry.

The head classes are importable from here (``from ghofl.heads import LDAHead``); each is loaded
on first use, so importing :mod:`ghofl.heads` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ghofl._lazy import lazy_attributes

if TYPE_CHECKING:
    from ghofl.heads.base import Head
    from ghofl.heads.fed3r import Fed3RHead
    from ghofl.heads.fedcgs import FedCGSHead
    from ghofl.heads.fedcof import FedCOFHead
    from ghofl.heads.fishermix import FisherMixHead
    from ghofl.heads.lda import LDAHead
    from ghofl.heads.nb import NBDiagHead
    from ghofl.heads.ncm import NCMHead
    from ghofl.heads.protohyper import ProtoHyperHead
    from ghofl.heads.qda import QDAHead
    from ghofl.heads.registry import (
        available_heads,
        head_class,
        load_head,
        make_head,
        parse_head_list,
        register_head,
        save_head,
    )
    from ghofl.heads.ridge import RidgeHead

#: Every exported name -> the module that defines it. The base class and the registry are
#: loaded on first use too (they import scipy), so that a module needing only a light piece of
#: the package (:mod:`ghofl.heads.presets`' names) does not load them.
_CLASSES = {
    "Head": "ghofl.heads.base",
    **{name: "ghofl.heads.registry" for name in (
        "available_heads", "head_class", "load_head", "make_head", "parse_head_list",
        "register_head", "save_head")},
    "NBDiagHead": "ghofl.heads.nb",
    "LDAHead": "ghofl.heads.lda",
    "QDAHead": "ghofl.heads.qda",
    "FedCGSHead": "ghofl.heads.fedcgs",
    "RidgeHead": "ghofl.heads.ridge",
    "NCMHead": "ghofl.heads.ncm",
    "Fed3RHead": "ghofl.heads.fed3r",
    "FedCOFHead": "ghofl.heads.fedcof",
    "FisherMixHead": "ghofl.heads.fishermix",
    "ProtoHyperHead": "ghofl.heads.protohyper",
}


__getattr__, __dir__ = lazy_attributes(__name__, _CLASSES)


__all__ = [
    "Fed3RHead",
    "FedCGSHead",
    "FedCOFHead",
    "FisherMixHead",
    "Head",
    "LDAHead",
    "NBDiagHead",
    "NCMHead",
    "ProtoHyperHead",
    "QDAHead",
    "RidgeHead",
    "available_heads",
    "head_class",
    "load_head",
    "make_head",
    "parse_head_list",
    "register_head",
    "save_head",
]
