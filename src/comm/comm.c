/* Placeholder: the communicator wrappers land here (issue 3). */
#include "comm_impl.h"

int pt_comm_placeholder_;
