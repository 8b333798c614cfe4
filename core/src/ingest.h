/* Moved: the container parsers' interface is core/src/formats/formats.h. */
#include "formats/formats.h"
