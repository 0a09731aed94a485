"""Compatibility shim (_SHIM_): this module is :mod:`raydp_hpo.searchers.base`."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("raydp_hpo.searchers.base")
