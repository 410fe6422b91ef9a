// Figures through QPainter: onto any paint device (the app's widgets, QImage, QSvgGenerator,
// QPdfWriter), and export to PNG (raster at `scale`), SVG and PDF (vector text and lines; the
// heatmap rasters embedded at one pixel per cell). Needs a QGuiApplication for fonts.
#pragma once

#include <QPainter>
#include <string>

#include "viz/figure.h"

namespace kvlens::viz {

// Draws the figure with its top-left at the painter's origin, 1 figure unit = 1 painter unit.
void paint_figure(const Figure& figure, QPainter& painter);

enum class ExportFormat { Png, Svg, Pdf };
// From the path's extension (.png, .svg, .pdf, any case); throws kvlens::Error otherwise.
ExportFormat export_format_of(const std::string& path);

// Writes the figure to `path` (atomically: a temporary beside it, renamed into place). PNG at
// `scale` device pixels per unit. Throws kvlens::Error naming the path when it cannot be written.
void export_figure(const Figure& figure, const std::string& path, double scale = 2.0);

// The family name of the bundled UI font (loaded from the binary's resources on first use).
QString figure_font_family();

}  // namespace kvlens::viz
