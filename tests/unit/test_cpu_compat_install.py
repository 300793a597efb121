"""The CPU compatibility installer tells our stand-ins from a real sgl_kernel, wherever the checkout lies."""

import os

from tangram_sglang.cpu_compat import install


def test_stand_ins_of_this_checkout():
    assert install.is_stand_in(os.path.join(install.SHIMS, "sgl_kernel", "__init__.py"))


def test_stand_ins_of_another_checkout():
    other = os.path.join(os.sep, "elsewhere", "repo", "tangram_sglang", "cpu_compat", "shims", "sgl_kernel",
                         "__init__.py")
    assert install.is_stand_in(other)


def test_a_real_kernel_package_is_not_a_stand_in():
    real = os.path.join(os.sep, "venv", "lib", "python3.11", "site-packages", "sgl_kernel", "__init__.py")
    assert not install.is_stand_in(real)
    # a directory merely named like ours is not enough: the whole tangram_sglang/cpu_compat/shims/ path is
    assert not install.is_stand_in(os.path.join(os.sep, "x", "shims", "sgl_kernel", "__init__.py"))
