"""Compatibility shim (_SHIM_): this module is :mod:`raydp_hpo.searchers.svt_threshold`."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("raydp_hpo.searchers.svt_threshold")
