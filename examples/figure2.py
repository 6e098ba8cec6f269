# The paper's Figure 2 program (Barham et al., MLSys 2022), with only the imports and
# jax.pmap -> pw.pmap changed.
import numpy
import pathways as pw


def get_devices(n):
  """Allocates `n` virtual TPU devices on an island."""
  device_set = pw.make_virtual_device_set()
  return device_set.add_slice(tpu_devices=n).tpus

a = pw.pmap(lambda x: x * 2., devices=get_devices(2))
b = pw.pmap(lambda x: x + 1., devices=get_devices(2))
c = pw.pmap(lambda x: x / 2., devices=get_devices(2))

@pw.program  # Program tracing (optional)
def f(v):
  x = a(v)
  y = b(x)
  z = a(c(x))
  return (y, z)

print(f(numpy.array([1., 2.])))
# output: (array([3., 5.]), array([2., 4.]))
