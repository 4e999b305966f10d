"""CuTe-DSL kernels and the machinery that specializes and compiles them.

Nothing here is imported by ``import frost``: the DSL costs seconds to import,
so engines import this package when they are first asked to compile.
"""
