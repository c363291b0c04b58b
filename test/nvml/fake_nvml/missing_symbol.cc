// A library that looks like NVML but lacks every function except
// nvmlInit_v2: the loader must name the first missing function.
extern "C" __attribute__((visibility("default"))) int nvmlInit_v2() { return 0; }
