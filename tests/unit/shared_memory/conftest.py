from tests.support.shm import shm_object

__all__ = ["shm_object"]
