"""The SparseCore primitives: each module defines primitives with their abstract
evaluation, interpreter rule and Mosaic lowering rule side by side."""
