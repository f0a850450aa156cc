"""ATen ops whose values are whatever memory held: only their shape and dtype can be compared.

Its own module because both the OpInfo corpus (opinfo.py) and the region value check (region_check.py)
read it, and opinfo reaches the backends: importing the list from there made the region check part of
an import cycle through the whole runtime.
"""
UNINITIALISED = ("empty", "new_empty", "empty_like", "empty_strided", "new_empty_strided", "empty_permuted")
