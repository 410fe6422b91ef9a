// QPainter renderer and PNG/SVG/PDF export of figures.
#include "viz/qt/painter_renderer.h"

#include <QBuffer>
#include <QFile>
#include <QFileInfo>
#include <QFontDatabase>
#include <QImage>
#include <QPageSize>
#include <QPdfWriter>
#include <QSaveFile>
#include <QSvgGenerator>
#include <cmath>

#include "engine/common/error.h"

static void init_kvlens_fonts() {
  Q_INIT_RESOURCE(kvlens_fonts);
}

namespace kvlens::viz {
namespace {

QColor qcolor(Color c) {
  return QColor(c.r, c.g, c.b, c.a);
}

QImage qimage(const ImageItem& item) {
  QImage image(item.width, item.height, QImage::Format_RGBA8888);
  for (int32_t y = 0; y < item.height; ++y) {
    uchar* line = image.scanLine(y);
    for (int32_t x = 0; x < item.width; ++x) {
      const Color c = item.pixels[size_t(y) * size_t(item.width) + size_t(x)];
      line[4 * x] = c.r, line[4 * x + 1] = c.g, line[4 * x + 2] = c.b, line[4 * x + 3] = c.a;
    }
  }
  return image;
}

void draw_text(QPainter& painter, const TextItem& item) {
  QFont font(figure_font_family());
  font.setPixelSize(std::max(1, int(std::lround(item.size))));
  font.setBold(item.bold);
  font.setStrikeOut(item.strike);
  painter.setFont(font);
  const QString text = QString::fromUtf8(item.text.data(), qsizetype(item.text.size()));
  const QFontMetricsF metrics(font);
  const double width = metrics.horizontalAdvance(text);
  double x = 0, y = 0;
  if (item.h == HAlign::Center) x = -width / 2;
  if (item.h == HAlign::Right) x = -width;
  switch (item.v) {
    case VAlign::Top:
      y = metrics.ascent();
      break;
    case VAlign::Middle:
      y = (metrics.ascent() - metrics.descent()) / 2;
      break;
    case VAlign::Baseline:
      y = 0;
      break;
    case VAlign::Bottom:
      y = -metrics.descent();
      break;
  }
  painter.save();
  painter.translate(item.anchor.x, item.anchor.y);
  if (item.rotation != 0.0f) painter.rotate(-item.rotation);
  if (item.background.a > 0) {
    const double pad = 2;
    painter.fillRect(QRectF(x - pad, y - metrics.ascent() - pad, width + 2 * pad,
                            metrics.ascent() + metrics.descent() + 2 * pad),
                     qcolor(item.background));
  }
  painter.setPen(qcolor(item.color));
  painter.drawText(QPointF(x, y), text);
  painter.restore();
}

}  // namespace

QString figure_font_family() {
  static const QString family = [] {
    init_kvlens_fonts();
    QString name = "DejaVu Sans";
    for (const char* path :
         {":/kvlens/fonts/DejaVuSans.ttf", ":/kvlens/fonts/DejaVuSans-Bold.ttf"}) {
      const int id = QFontDatabase::addApplicationFont(path);
      if (id >= 0 && !QFontDatabase::applicationFontFamilies(id).isEmpty())
        name = QFontDatabase::applicationFontFamilies(id).first();
    }
    return name;
  }();
  return family;
}

void paint_figure(const Figure& figure, QPainter& painter) {
  painter.save();
  painter.setRenderHint(QPainter::Antialiasing, true);
  painter.setRenderHint(QPainter::TextAntialiasing, true);
  painter.setRenderHint(QPainter::SmoothPixmapTransform, false);  // one cell, one sharp block
  painter.fillRect(QRectF(0, 0, figure.width, figure.height), qcolor(figure.background));
  for (const Item& item : figure.items) {
    if (const auto* image = std::get_if<ImageItem>(&item)) {
      if (image->width <= 0 || image->height <= 0) continue;
      painter.drawImage(QRectF(image->box.x, image->box.y, image->box.w, image->box.h),
                        qimage(*image));
    } else if (const auto* rect = std::get_if<RectItem>(&item)) {
      const QRectF box(rect->box.x, rect->box.y, rect->box.w, rect->box.h);
      if (rect->fill.a > 0) painter.fillRect(box, qcolor(rect->fill));
      if (rect->stroke.a > 0) {
        QPen pen(qcolor(rect->stroke));
        pen.setWidthF(rect->stroke_width);
        pen.setJoinStyle(Qt::MiterJoin);
        painter.setPen(pen);
        painter.setBrush(Qt::NoBrush);
        painter.drawRect(box);
      }
    } else if (const auto* line = std::get_if<LineItem>(&item)) {
      if (line->points.size() < 2) continue;
      QPen pen(qcolor(line->color));
      pen.setWidthF(line->width);
      if (line->dashed) pen.setStyle(Qt::DashLine);
      painter.setPen(pen);
      QPolygonF points;
      for (const Point& p : line->points) points << QPointF(p.x, p.y);
      painter.drawPolyline(points);
    } else if (const auto* circle = std::get_if<CircleItem>(&item)) {
      painter.setBrush(circle->fill.a > 0 ? QBrush(qcolor(circle->fill)) : QBrush(Qt::NoBrush));
      if (circle->stroke.a > 0) {
        painter.setPen(QPen(qcolor(circle->stroke), 1.0));
      } else {
        painter.setPen(Qt::NoPen);
      }
      painter.drawEllipse(QPointF(circle->center.x, circle->center.y), circle->radius,
                          circle->radius);
    } else if (const auto* text = std::get_if<TextItem>(&item)) {
      draw_text(painter, *text);
    }
  }
  painter.restore();
}

ExportFormat export_format_of(const std::string& path) {
  const QString suffix = QFileInfo(QString::fromStdString(path)).suffix().toLower();
  if (suffix == "png") return ExportFormat::Png;
  if (suffix == "svg") return ExportFormat::Svg;
  if (suffix == "pdf") return ExportFormat::Pdf;
  throw Error(path, "extension", ".png, .svg or .pdf", "'." + suffix.toStdString() + "'");
}

void export_figure(const Figure& figure, const std::string& path, double scale) {
  const ExportFormat format = export_format_of(path);
  QByteArray bytes;
  if (format == ExportFormat::Png) {
    QImage image(int(std::ceil(figure.width * scale)), int(std::ceil(figure.height * scale)),
                 QImage::Format_ARGB32_Premultiplied);
    image.setDevicePixelRatio(scale);
    image.fill(Qt::transparent);
    {
      QPainter painter(&image);
      paint_figure(figure, painter);
    }
    QBuffer buffer(&bytes);
    buffer.open(QIODevice::WriteOnly);
    if (!image.save(&buffer, "PNG")) throw Error(path, "PNG", "an encodable image");
  } else if (format == ExportFormat::Svg) {
    QBuffer buffer(&bytes);
    buffer.open(QIODevice::WriteOnly);
    QSvgGenerator svg;
    svg.setOutputDevice(&buffer);
    svg.setSize(QSize(int(std::ceil(figure.width)), int(std::ceil(figure.height))));
    svg.setViewBox(QRectF(0, 0, figure.width, figure.height));
    svg.setResolution(96);
    svg.setTitle("kvlens figure");
    QPainter painter(&svg);
    paint_figure(figure, painter);
  } else {
    QBuffer buffer(&bytes);
    buffer.open(QIODevice::WriteOnly);
    QPdfWriter pdf(&buffer);
    pdf.setTitle("kvlens figure");
    pdf.setCreator("kvlens");
    // One figure unit = 1/96 inch (a CSS pixel), the page the figure's size.
    pdf.setResolution(96);
    pdf.setPageSize(QPageSize(QSizeF(figure.width * 72.0 / 96.0, figure.height * 72.0 / 96.0),
                              QPageSize::Point));
    pdf.setPageMargins(QMarginsF(0, 0, 0, 0));
    QPainter painter(&pdf);
    paint_figure(figure, painter);
  }
  QSaveFile file(QString::fromStdString(path));
  if (!file.open(QIODevice::WriteOnly) || file.write(bytes) != bytes.size() || !file.commit()) {
    throw Error(path, "file", "a writable path", file.errorString().toStdString());
  }
}

}  // namespace kvlens::viz
