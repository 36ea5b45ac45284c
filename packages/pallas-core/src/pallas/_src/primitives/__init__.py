"""Generic kernel primitives: each module defines primitives and their interpreter rules."""
