"""One Stable Audio Open model over several GPUs of a host: CFG-parallel, tensor parallel, Ulysses sequence
parallel (and cfg+tp / cfg+sp). Start with `group.py`; `plan.py` says which rank does what."""
