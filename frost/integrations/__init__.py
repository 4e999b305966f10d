"""Adapters that put frost behind other libraries' attention hooks.

Each adapter is its own module and imports its library only when imported itself, so
``import frost`` never needs them: ``frost.integrations.transformers`` (Hugging Face
transformers' ``attn_implementation="frost"``, the ``transformers`` extra).
"""
