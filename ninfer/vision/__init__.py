"""Images in: what users send, decoded and placed in the conversation.

    parts.py    content parts: which carry media, the refusal without a vision tower, and the
                normalised form (`{"type": "image", "image": <RGB PIL image>}`) the chat
                template renders as `<|vision_start|><|image_pad|><|vision_end|>`
    media.py    one image from a path, a PIL image, bytes, a `data:` URL or an Anthropic
                base64 source, decoded to RGB within size limits

This package knows nothing about the model, the engine or the cache: it hands on pixels.
"""
