ds_accelerator = None


def get_accelerator():
    global ds_accelerator
    if ds_accelerator is None:
        from .cpu_accelerator import CPU_Accelerator

        ds_accelerator = CPU_Accelerator()
    return ds_accelerator


def set_accelerator(accelerator):
    global ds_accelerator
    ds_accelerator = accelerator
