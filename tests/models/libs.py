"""Importing the libraries the conformance suite's models come from, or skipping with the reason.

torchvision's wheel on the package registry is built against CUDA torch: with the CPU torch these
machines pin, its native extension (nms, roi_align, ...: detection ops the suite never calls) does not
load, and its import then fails registering a fake kernel for `torchvision::nms`/`qnms`. Declaring
those two schemas first (no kernel: calling them still fails) lets the pure-Python model definitions
import (transformers imports torchvision too); a torchvision whose extension loads never reaches the
declaration.
"""
from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch

_DETECTION_SCHEMAS = {"nms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
                      "qnms": "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"}


def _declare_detection_schemas() -> None:
    for name, schema in _DETECTION_SCHEMAS.items():
        if not hasattr(torch.ops.torchvision, name):
            torch.library.define(f"torchvision::{name}", schema)


def torchvision_or_skip() -> ModuleType:
    try:
        return importlib.import_module("torchvision")
    except ImportError as exc:
        pytest.skip(f"torchvision is not installed ({exc}): pip install torchvision==0.28.0 --no-deps")
    except RuntimeError:   # its native extension did not load (a CUDA build under CPU torch)
        _declare_detection_schemas()
        try:
            return importlib.import_module("torchvision")
        except Exception as exc:
            pytest.skip(f"torchvision does not import with torch {torch.__version__}: {exc}")
    raise AssertionError("unreachable")


def library_or_skip(name: str) -> ModuleType:
    if name == "torchvision":
        return torchvision_or_skip()
    if name == "transformers":   # it imports torchvision when that is installed: prepare it first
        try:
            torchvision_or_skip()
        except pytest.skip.Exception:
            pass
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        pytest.skip(f"{name} is not installed ({exc}): pip install '.[test]'")
    raise AssertionError("unreachable")
