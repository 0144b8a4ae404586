"""The TLX (Triton Low-level Extensions) kernels for Hopper, sm_90a, composed of parts:
``pipeline`` (rings, barriers, the walk, the dQ reduce-add), ``descriptors`` (host TMA
descriptors), ``fwd_mainloop`` + ``fwd_sm90`` (the forward), ``bwd_preprocess``,
``bwd_mainloop`` + ``bwd_sm90`` (the backward), ``configs`` (the declared configuration space).

Importing any module but this one and ``configs`` needs the TLX plugin (``triton-utlx``).
"""
