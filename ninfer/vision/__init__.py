"""Images in: what users send, decoded and placed in the conversation, then turned into the
tower's inputs and the positions of the image tokens in a prompt.

    parts.py        content parts: which carry media, the refusal without a vision tower, and
                    the normalised form (`{"type": "image", "image": <RGB PIL image>}`) the
                    chat template renders as `<|vision_start|><|image_pad|><|vision_end|>`
    media.py        one image from a path, a PIL image, bytes, a `data:` URL or an Anthropic
                    base64 source, decoded to RGB within size limits
    preprocess.py   an RGB image -> resized, normalised patches (`pixel_values`), its patch
                    grid, its number of pad tokens and the digest of its resized pixels, as the
                    checkpoint's `preprocessor_config.json` says
    positions.py    the 3-D (t, h, w) rotary positions of a prompt with image spans, and the
                    rope delta of the tokens after it
    prompt.py       a rendered prompt's images processed and its pads expanded: the spans and
                    the rope delta (`VisionPrompt`)

This package knows nothing about the model, the engine or the cache.
"""
