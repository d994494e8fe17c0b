"""SSL methods: VICReg, SwAV, SimSiam with their official head layouts, and Generic."""

from e2mc.methods.base import MethodOutput, SSLMethod

__all__ = ["MethodOutput", "SSLMethod"]
