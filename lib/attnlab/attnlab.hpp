// attnlab: efficient attention variants behind one interface. Include this one header.
#pragma once

#include "attnlab/attention.hpp"
#include "attnlab/error.hpp"
#include "attnlab/factory.hpp"
#include "attnlab/mask.hpp"
#include "attnlab/metrics.hpp"
#include "attnlab/reference.hpp"
#include "attnlab/tensor.hpp"
