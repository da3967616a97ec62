# Stands in for a torchvision wheel built for another torch: it fails at import
# with RuntimeError (not ImportError), as the CUDA-only wheel does on this machine.
raise RuntimeError("operator torchvision::nms does not exist")
