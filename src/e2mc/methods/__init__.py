"""SSL methods with their official head layouts: VICReg, SwAV, SimSiam (the paper's), Barlow
Twins, SimCLR, BYOL, MoCo v3, DINO, and Generic."""

from e2mc.methods.barlowtwins import BarlowTwins, barlowtwins_loss
from e2mc.methods.base import MethodOutput, SSLMethod
from e2mc.methods.byol import BYOL, byol_loss
from e2mc.methods.dino import DINO, dino_loss
from e2mc.methods.generic import Generic
from e2mc.methods.mocov3 import MoCoV3, mocov3_loss
from e2mc.methods.registry import METHODS, build_method
from e2mc.methods.simclr import SimCLR, nt_xent_loss
from e2mc.methods.simsiam import SimSiam, simsiam_loss
from e2mc.methods.swav import SwAV, sinkhorn
from e2mc.methods.vicreg import VICReg, vicreg_loss

__all__ = ["BYOL", "DINO", "METHODS", "BarlowTwins", "Generic", "MethodOutput", "MoCoV3",
           "SSLMethod", "SimCLR", "SimSiam", "SwAV", "VICReg", "barlowtwins_loss", "build_method",
           "byol_loss", "dino_loss", "mocov3_loss", "nt_xent_loss", "simsiam_loss", "sinkhorn",
           "vicreg_loss"]
