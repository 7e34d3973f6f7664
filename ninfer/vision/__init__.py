"""Images in: pixels to the tower's inputs, and where image tokens sit in a prompt.

    preprocess.py   an RGB image -> resized, normalised patches (`pixel_values`), its patch
                    grid, its number of pad tokens and the digest of its resized pixels, as the
                    checkpoint's `preprocessor_config.json` says
    positions.py    the 3-D (t, h, w) rotary positions of a prompt with image spans, and the
                    rope delta of the tokens after it

This package knows nothing about the model, the engine or the cache.
"""
