namespace pipelstm {

bool built_with_cuda() {
#if defined(PIPELSTM_WITH_CUDA)
  return true;
#else
  return false;
#endif
}

}  // namespace pipelstm
