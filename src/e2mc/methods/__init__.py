"""SSL methods: VICReg, SwAV, SimSiam with their official head layouts, and Generic."""

from e2mc.methods.base import MethodOutput, SSLMethod
from e2mc.methods.generic import Generic
from e2mc.methods.registry import METHODS, build_method
from e2mc.methods.simsiam import SimSiam, simsiam_loss
from e2mc.methods.swav import SwAV, sinkhorn
from e2mc.methods.vicreg import VICReg, vicreg_loss

__all__ = ["METHODS", "Generic", "MethodOutput", "SSLMethod", "SimSiam", "SwAV", "VICReg",
           "build_method", "simsiam_loss", "sinkhorn", "vicreg_loss"]
