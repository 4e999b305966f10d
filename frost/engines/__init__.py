"""frost's engines: the contract (``base``), the native torch fallbacks (``native``) and,
from later issues, frost's own SM80 kernels. ``frost.dispatch`` ranks them."""
