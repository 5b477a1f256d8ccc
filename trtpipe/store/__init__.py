"""Content-addressed artifact store: objects, entries, keys, digest cache, gc.

Import the parts you need (`trtpipe.store.local.Store`, `trtpipe.store.keys`); this package
imports nothing heavy so the warm build path stays fast.
"""
