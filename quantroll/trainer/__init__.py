"""The trainer side of the RL loop.

``losses``, ``corrections`` and ``advantages`` are pure tensor functions (no model, no
engine): they take padded ``[B, T]`` response-token tensors with a ``mask`` (nonzero =
a response token that counts) and return tensors, so each can be checked by hand.
"""
