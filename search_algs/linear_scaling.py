"""Compatibility shim (_SHIM_): this module is :mod:`raydp_hpo.searchers.linear_scaling`."""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("raydp_hpo.searchers.linear_scaling")
